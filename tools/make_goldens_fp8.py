#!/usr/bin/env python3
"""Build the FP8 golden fixtures in tests/golden/ (both FP8 checkpoint forms).

Run by hand, never by CI (torch + transformers, tools/requirements-goldens.txt):

    python3 -m venv /tmp/gvenv
    /tmp/gvenv/bin/pip install -r tools/requirements-goldens.txt
    nice /tmp/gvenv/bin/python tools/make_goldens_fp8.py

For each case it builds a tiny random Glm4MoeForCausalLM exactly as
tools/make_goldens.py does (its functions are imported, not copied), with
dimensions that are NOT multiples of 128 (hidden 160, head_dim 40,
intermediate 200, expert width 48), then quantizes every linear layer's
weight to FP8 e4m3 itself:

  fp8_block_fp32    quant_method "fp8" (DeepSeek-V3 / GLM-5-FP8 form):
                    weight_scale_inv F32 per 128x128 block; the edge blocks
                    are 128-wide blocks cut short (a 160-wide dimension is one
                    block of 128 and one of 32, never two of 80).
  fp8_channel_fp32  quant_method "compressed-tensors", format
                    "float-quantized", strategy "channel" (the GLM-4.5-FP8 /
                    GLM-4.5-Air-FP8 form): weight_scale BF16 [out, 1].

scale = amax / 448 over the block or row; q = e4m3(clamp(w / scale)). A few
codes per matrix are then overwritten with subnormal codes (0x01, 0x83,
0x07) so the loader's subnormal decoding is exercised. The reference is the
same checkpoint DEQUANTIZED here (q.float() * scale in fp32, one rounding)
and saved as an fp32 checkpoint, which Transformers' Glm4MoeForCausalLM
runs in fp32 (record() of make_goldens.py: logits, hidden states, greedy
tokens, plus its numpy forward as an independent check). Transformers' own
FP8 loader is not used: it was seen splitting partial blocks evenly. The
embedding, router gates, norms and lm_head stay fp32 (the `ignore` /
`modules_to_not_convert` lists name the head and the gates).
"""

import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402

BLOCK = 128
E4M3_MAX = 448.0
SUBNORMAL_CODES = (0x01, 0x83, 0x07)  # 2^-9, -3 * 2^-9, 7 * 2^-9

SHAPE = dict(num_hidden_layers=2, hidden_size=160, head_dim=40, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=200, moe_intermediate_size=48,
             use_qk_norm=True, attention_bias=True, partial_rotary_factor=0.5,
             rope_theta=10000.0, first_k_dense_replace=1, n_group=1, topk_group=1,
             num_experts_per_tok=2, norm_topk_prob=True, routed_scaling_factor=2.5)

CASES = [
    dict(name="fp8_block_fp32", form="block", seed=14001, prompt_len=9, dtype="float32",
         description=("Block-scaled FP8 (quant_method fp8, weight_block_size [128, 128], "
                      "weight_scale_inv F32): hidden 160, head_dim 40, intermediate 200, "
                      "expert width 48, so every matrix has partial edge blocks; layer 0 "
                      "dense, layer 1 MoE top-2 of 8 with a shared expert; q/k norm, "
                      "biases, partial RoPE. Reference: the dequantized fp32 checkpoint "
                      "in Transformers' fp32 forward."),
         config=SHAPE),
    dict(name="fp8_channel_fp32", form="channel", seed=14101, prompt_len=9, dtype="float32",
         description=("compressed-tensors FP8 (float-quantized, strategy channel, "
                      "weight_scale BF16 [out, 1], dynamic per-token activations), same "
                      "shapes as fp8_block_fp32. Reference: the dequantized fp32 "
                      "checkpoint in Transformers' fp32 forward."),
         config=SHAPE),
]


def is_fp8_linear(name, t):
    if t.dim() != 2 or not name.endswith(".weight"):
        return False
    return not (name == "model.embed_tokens.weight" or name == "lm_head.weight"
                or name.endswith("mlp.gate.weight"))


def quantize(w, form):
    """e4m3 codes and fp32 scales (blocks cut short at the edges)."""
    rows, cols = w.shape
    if form == "channel":
        scale = (w.abs().amax(dim=1, keepdim=True) / E4M3_MAX).to(torch.bfloat16).float()
        full = scale.expand(rows, cols)
    else:
        br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
        scale = torch.zeros(br, bc)
        for i in range(br):
            for j in range(bc):
                blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
                scale[i, j] = blk.abs().max() / E4M3_MAX
        full = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    q = (w / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    codes = q.view(torch.uint8).clone()
    for k, code in enumerate(SUBNORMAL_CODES):
        codes.view(-1)[k * 7] = code
    q = codes.view(torch.float8_e4m3fn)
    return q, scale, full


def dequantize(q, full):
    return q.float() * full  # fp32 product, one rounding: what the C++ loader computes


def quant_config(form):
    if form == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [BLOCK, BLOCK],
                "modules_to_not_convert": ["lm_head", "mlp.gate"]}
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed", "kv_cache_scheme": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                        "strategy": "channel", "dynamic": False, "group_size": None,
                        "block_structure": None, "observer": "minmax"},
            "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                  "strategy": "token", "dynamic": True, "observer": None},
            "output_activations": None}},
        "ignore": ["lm_head", "re:.*mlp\\.gate$"],
    }


def build_pair(case, seed, fp8_dir, deq_dir):
    """Writes the FP8 checkpoint and its dequantized fp32 twin; returns stats."""
    model = mg.build_model(case, seed)
    with tempfile.TemporaryDirectory() as tmp:
        mg.save_checkpoint(model, case, tmp)
        tensors = load_file(os.path.join(tmp, "model.safetensors"))
        with open(os.path.join(tmp, "config.json")) as f:
            cfg = json.load(f)
    fp8, deq, stats = {}, {}, dict(fp8_matrices=0, partial_block_matrices=0)
    for name in sorted(tensors):
        t = tensors[name]
        if not is_fp8_linear(name, t):
            fp8[name] = deq[name] = t.contiguous()
            continue
        q, scale, full = quantize(t.float(), case["form"])
        fp8[name] = q.contiguous()
        suffix = "weight_scale_inv" if case["form"] == "block" else "weight_scale"
        sname = name[:-len("weight")] + suffix
        fp8[sname] = (scale if case["form"] == "block" else scale.to(torch.bfloat16)).contiguous()
        deq[name] = dequantize(q, full).contiguous()
        stats["fp8_matrices"] += 1
        stats["partial_block_matrices"] += int(t.shape[0] % BLOCK != 0 or t.shape[1] % BLOCK != 0)
    for d in (fp8_dir, deq_dir):
        os.makedirs(d, exist_ok=True)
    save_file(deq, os.path.join(deq_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(deq_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file(fp8, os.path.join(fp8_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(cfg, quantization_config=quant_config(case["form"]))
    with open(os.path.join(fp8_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return model, stats


def run_case(case):
    d = os.path.join(mg.GOLDEN, case["name"])
    for attempt in range(40):
        seed = case["seed"] + attempt
        if os.path.isdir(d):
            shutil.rmtree(d)
        with tempfile.TemporaryDirectory() as deq_dir:
            model, stats = build_pair(case, seed, d, deq_dir)
            g = torch.Generator().manual_seed(seed)
            prompt = torch.randint(0, model.config.vocab_size, (case["prompt_len"],),
                                   generator=g).tolist()
            info = mg.record(case, deq_dir, seed, prompt)
            ok = info["min_top2_gap"] > mg.MIN_TOP2_GAP \
                and info["min_route_gap"] > mg.MIN_ROUTE_GAP \
                and info["router"]["bias_changed_selections"] > 0 \
                and len(set(info["greedy"])) >= 4
            print(f"  seed {seed}: greedy {info['greedy']} top2 gap {info['min_top2_gap']:.4f} "
                  f"route gap {info['min_route_gap']:.4f} -> {'ok' if ok else 'reseed'}")
            if not ok:
                continue
            nl, nh = mg.np_forward(deq_dir, prompt)
        info["np_diff"] = dict(
            logits=float(f"{abs(nl - info['logits']).max():.3g}"),
            hidden_states=float(f"{abs(nh - info['hidden']).max():.3g}"))
        assert info["np_diff"]["logits"] < 1e-3 and info["np_diff"]["hidden_states"] < 1e-3
        extra = dict(fp8=dict(form=case["form"], block=BLOCK if case["form"] == "block" else None,
                              subnormal_codes_per_matrix=len(SUBNORMAL_CODES),
                              reference="dequantized fp32 checkpoint (q.float() * scale), "
                                        "Transformers fp32 forward", **stats))
        mg.write_case(case, d, seed, prompt, info, extra)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"  {case['name']}: {stats} greedy {info['greedy']} size {size / 1024:.0f} KiB")
        return
    raise RuntimeError(f"no good seed for {case['name']}")


def main():
    torch.set_num_threads(1)
    for case in CASES:
        print(case["name"])
        run_case(case)


if __name__ == "__main__":
    main()
