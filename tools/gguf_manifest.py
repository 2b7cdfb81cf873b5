#!/usr/bin/env python3
"""Splits a GGUF converted from a Hugging Face checkpoint into what tools/gguf_fill.cc needs to
rebuild it elsewhere from the same checkpoint: the skeleton (every byte before the tensor data)
and a manifest of where each tensor's bytes come from. Run by hand where llama.cpp's converter
runs (it needs llama.cpp's gguf-py); the pair travels to a host without Python (a bare GPU host,
tools/gpu_bundle.sh --llamacpp), where `glm-run --save` writes the same checkpoint and
gguf_fill writes the same GGUF.

    python tools/gguf_manifest.py MODEL.gguf CHECKPOINT_DIR OUT_DIR [--verify]

No tensor names are assumed: each GGUF tensor is matched to checkpoint tensors by content (the
same bytes; bf16 widened to fp32, as the converter stores norms and biases; or a 3-D tensor's
slices, the converter's stacked experts, each one checkpoint tensor). A tensor that matches
nothing stops the script. --verify rebuilds the file with gguf_fill (GGUF_FILL, default
gguf_fill on PATH) and compares it with the original byte for byte.
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys

import numpy as np
from gguf import GGUFReader


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def safetensors_index(directory):
    """name -> (file, absolute offset, bytes, dtype) for every tensor of the checkpoint."""
    index, checks = {}, []
    for file in sorted(os.listdir(directory)):
        if not file.endswith(".safetensors"):
            continue
        with open(os.path.join(directory, file), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header_bytes = f.read(n)
        checks.append((file, 8 + n, fnv1a64(struct.pack("<Q", n) + header_bytes)))
        for name, info in json.loads(header_bytes).items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            index[name] = (file, 8 + n + begin, end - begin, info["dtype"])
    return index, checks


def digest(data):
    return hashlib.blake2b(data, digest_size=16).digest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf")
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--verify", action="store_true")
    args = parser.parse_args()

    index, checks = safetensors_index(args.checkpoint)
    maps = {}
    raw, widened = {}, {}  # digest -> (name, source bytes)
    for name, (file, offset, n, dtype) in index.items():
        if file not in maps:
            maps[file] = np.memmap(os.path.join(args.checkpoint, file), np.uint8, "r")
        data = maps[file][offset:offset + n]
        raw.setdefault(digest(data.tobytes()), name)
        if dtype == "BF16":
            wide = (data.view(np.uint16).astype(np.uint32) << 16).tobytes()
            widened.setdefault(digest(wide), name)

    reader = GGUFReader(args.gguf)
    gguf_map = np.memmap(args.gguf, np.uint8, "r")
    data_start = min(t.data_offset for t in reader.tensors)
    records = []
    for t in reader.tensors:
        n = int(t.n_bytes)
        data = gguf_map[t.data_offset:t.data_offset + n]
        d = digest(data.tobytes())
        if d in raw:
            file, offset, size, _ = index[raw[d]]
            records.append(f"copy {t.data_offset} {file} {offset} {size}")
            continue
        if d in widened:
            file, offset, size, _ = index[widened[d]]
            records.append(f"f32 {t.data_offset} {file} {offset} {size}")
            continue
        slices = int(t.shape[-1]) if len(t.shape) == 3 else 0  # gguf shapes are innermost first
        if slices and n % slices == 0:
            step, parts = n // slices, []
            for s in range(slices):
                part = digest(data[s * step:(s + 1) * step].tobytes())
                if part not in raw:
                    break
                file, offset, size, _ = index[raw[part]]
                parts.append(f"copy {t.data_offset + s * step} {file} {offset} {size}")
            if len(parts) == slices:
                records += parts
                continue
        sys.exit(f"gguf_manifest: tensor {t.name} ({n} bytes) matches nothing in the checkpoint")

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "skeleton.bin"), "wb") as f:
        f.write(gguf_map[:data_start].tobytes())
    manifest = os.path.join(args.out, "manifest.txt")
    with open(manifest, "w") as f:
        f.write(f"gguf-fill 1 {os.path.getsize(args.gguf)}\n")
        for file, n, h in checks:
            f.write(f"check {file} {n} {h:016x}\n")
        f.write("\n".join(records) + "\n")
    print(f"gguf_manifest: {len(reader.tensors)} tensors, {len(records)} records, skeleton "
          f"{data_start} bytes -> {args.out}")
    if args.verify:
        rebuilt = os.path.join(args.out, "rebuilt.gguf")
        subprocess.run([os.environ.get("GGUF_FILL", "gguf_fill"),
                        os.path.join(args.out, "skeleton.bin"), manifest, args.checkpoint,
                        rebuilt], check=True)
        same = subprocess.run(["cmp", args.gguf, rebuilt]).returncode == 0
        os.remove(rebuilt)
        print(f"gguf_manifest: rebuilt file {'identical' if same else 'DIFFERS'}")
        sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
