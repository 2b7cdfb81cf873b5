#!/usr/bin/env python3
"""tools/model_sizing.py, the source of docs/operations.md's sizing figures:

- its parameter count is exact: for every checkpoint under tests/golden, the elements of the
  tensors in the safetensors headers (the MTP layer apart) equal the count from config.json,
  and so do the MTP layer's where the checkpoint has one. The golden models cover QK-norm,
  attention biases, tied embeddings, 0 and 2 dense layers, grouped routing, fused experts, and
  GLM-5's latent attention with full and shared indexer layers;
- every line it prints for GLM-4.5, GLM-4.5-Air and GLM-5 appears verbatim in docs/operations.md;
- it refuses a config of another architecture (model_type other than glm4_moe, glm_moe_dsa).
"""
import argparse
import glob
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploylib as dl  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    root = ap.parse_args().root
    f = dl.Failures()
    tool = os.path.join(root, "tools/model_sizing.py")
    spec = importlib.util.spec_from_file_location("model_sizing", tool)
    ms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ms)

    dirs = sorted(d for d in glob.glob(os.path.join(root, "tests/golden/*/"))
                  if os.path.exists(os.path.join(d, "config.json")))
    f.check(len(dirs) >= 5, f"expected the golden checkpoints, found {len(dirs)}")
    for d in dirs:
        with open(os.path.join(d, "config.json")) as fh:
            raw = json.load(fh)
            c = dict(ms.DEFAULTS_GLM5 if raw.get("model_type") == "glm_moe_dsa" else ms.DEFAULTS,
                     **raw)
        if c.get("head_dim") is None:
            c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
        served = mtp = 0
        stored_head = False
        mtp_head = False  # model_sizing counts the MTP layer with its own head, as releases store it
        for path in glob.glob(os.path.join(d, "*.safetensors")):
            with open(path, "rb") as fh:
                header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
            for name, t in header.items():
                # FP8 checkpoints' scales (docs/fp8.md) are not parameters of the model.
                if name == "__metadata__" or name.endswith((".weight_scale", ".weight_scale_inv")):
                    continue
                n = 1
                for x in t["shape"]:
                    n *= x
                stored_head |= name == "lm_head.weight"
                mtp_head |= name.endswith(".shared_head.head.weight")
                m = re.match(r"model\.layers\.(\d+)\.", name)
                if m and int(m.group(1)) >= c["num_hidden_layers"]:
                    mtp += n
                else:
                    served += n
        bf16, fp32, _, mtp_bf16, mtp_fp32 = ms.count(c)
        if c.get("tie_word_embeddings") and stored_head:
            # A tied config whose checkpoint also stores a head: Transformers 5.x (and the
            # engine) use that head, so it is served on top of what the config alone implies.
            bf16 += c["vocab_size"] * c["hidden_size"]
        name = os.path.basename(d.rstrip("/"))
        f.check(served == bf16 + fp32, f"{name}: checkpoint has {served} parameters, model_sizing counts {bf16 + fp32}")
        if mtp and not mtp_head:
            mtp_bf16 -= c["vocab_size"] * c["hidden_size"]  # the MTP layer reads lm_head
        if mtp:
            f.check(mtp == mtp_bf16 + mtp_fp32, f"{name}: MTP layer has {mtp} parameters, model_sizing counts {mtp_bf16 + mtp_fp32}")
        print(f"{name}: {served} parameters{f' + {mtp} MTP' if mtp else ''}: exact")

    out = subprocess.run([sys.executable, tool], capture_output=True, text=True, check=True).stdout
    doc = open(os.path.join(root, "docs/operations.md")).read()
    lines = [line for line in out.splitlines() if line.strip()]
    for line in lines:
        f.check(line in doc, f"docs/operations.md lacks tools/model_sizing.py's line: {line}")
    # A config of another architecture is refused with a message, not sized with GLM defaults.
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".json") as llama:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                   "num_hidden_layers": 32, "num_attention_heads": 32}, llama)
        llama.flush()
        r = subprocess.run([sys.executable, tool, llama.name], capture_output=True, text=True)
        f.check(r.returncode != 0 and "not 'glm4_moe'" in r.stderr and not r.stdout,
                f"model_sizing.py must refuse a Llama config: rc {r.returncode}, {r.stdout!r} {r.stderr!r}")
    golden = os.path.join(root, "tests/golden/bf16/config.json")
    r = subprocess.run([sys.executable, tool, golden], capture_output=True, text=True)
    f.check(r.returncode == 0 and r.stdout, f"model_sizing.py must size a glm4_moe config: {r.stderr}")
    golden5 = os.path.join(root, "tests/golden/glm5_bf16/config.json")
    r = subprocess.run([sys.executable, tool, golden5], capture_output=True, text=True)
    f.check(r.returncode == 0 and "KV per token" in r.stdout,
            f"model_sizing.py must size a glm_moe_dsa config: {r.stderr}")
    return f.finish("check_sizing")


if __name__ == "__main__":
    sys.exit(main())
