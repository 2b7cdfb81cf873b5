#!/usr/bin/env python3
"""Build the block-scaled FP8 GLM-5 golden fixture tests/golden/glm5_fp8_block_fp32.

Run by hand, never by CI (torch + transformers, tools/requirements-goldens.txt):

    nice /tmp/gvenv/bin/python tools/make_goldens_glm5_fp8.py

The GLM-5 sibling of tools/make_goldens_fp8.py, built from the functions of that script and
of tools/make_goldens_glm5.py (imported, not copied). A tiny random GlmMoeDsaForCausalLM
whose widths are NOT multiples of 128 (hidden 160, q_lora_rank 136, kv_lora_rank 144, so
kv_a_proj_with_mqa is [152, 160] and kv_b_proj [160, 144]) is quantized here to the
GLM-5-FP8 / DeepSeek-V3 form: quant_method "fp8", weight_block_size [128, 128], F8_E4M3
weights with an F32 weight_scale_inv per 128x128 block, the edge blocks 128-wide blocks cut
short, a few subnormal codes per matrix. Kept unquantized (modules_to_not_convert): the head,
the router gates and the indexer's weights_proj (Transformers keeps it fp32; the released
GLM-5-FP8 keeps the indexer's weights_proj and k_norm out of FP8, as NVIDIA NeMo's
GlmMoeDsaStateDictAdapter lists them). The embedding and every 1-D parameter stay fp32.

The reference is the same checkpoint DEQUANTIZED here (q.float() * scale in fp32, one
rounding) and saved as an fp32 checkpoint, run by Transformers' GlmMoeDsaForCausalLM in fp32
through make_goldens_glm5.record (logits, hidden states, greedy tokens, the indexer's
selection margins, both above 5e-3 so that the CUDA runner's bf16 activations keep every
route and selection). Transformers' own FP8 loader is not used (it was seen splitting partial
blocks evenly). index_topk is 8 and the prompt 20 tokens, so 40 queries are sparse.
"""

import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402
import make_goldens_fp8 as mf  # noqa: E402
import make_goldens_glm5 as m5  # noqa: E402

SHAPE = dict(hidden_size=160, q_lora_rank=136, kv_lora_rank=144, qk_nope_head_dim=16,
             qk_rope_head_dim=8, v_head_dim=24, index_n_heads=8, index_head_dim=16,
             intermediate_size=200, moe_intermediate_size=48, n_routed_experts=4)

CASE = dict(
    name="glm5_fp8_block_fp32", seed=15001, prompt_len=20, dtype="float32",
    description=("Block-scaled FP8 GLM-5 (quant_method fp8, weight_block_size [128, 128], "
                 "weight_scale_inv F32): hidden 160, q_lora 136, kv_lora 144, 4 heads "
                 "(nope 16, rope 8, v 24), indexer 8 x 16 top-8, intermediate 200, expert "
                 "width 48, 4 experts top-2; layers dense/MoE/MoE/MoE, indexer "
                 "full/shared/full/shared; every attention and MLP matrix FP8 with partial "
                 "edge blocks (kv_b_proj [160, 144] among them), head, gates and indexer "
                 "weights_proj unquantized. Reference: the dequantized fp32 checkpoint in "
                 "Transformers' fp32 forward; 20-token prompt, so 40 sparse queries."))

# Route and selection margins the bf16 device preserves (make_goldens.py's MIN_ROUTE_GAP).
DEVICE_SAFE_GAP = mg.MIN_ROUTE_GAP

QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [mf.BLOCK, mf.BLOCK],
                "modules_to_not_convert": ["lm_head", "mlp.gate", "indexer.weights_proj"]}


def is_fp8(name, t):
    return mf.is_fp8_linear(name, t) and not name.endswith("indexer.weights_proj.weight")


def build_pair(seed, fp8_dir, deq_dir):
    """Writes the FP8 checkpoint and its dequantized fp32 twin; returns stats."""
    saved = dict(m5.COMMON)
    m5.COMMON.update(SHAPE)
    try:
        model = m5.build_model(CASE, seed)
    finally:
        m5.COMMON.clear()
        m5.COMMON.update(saved)
    m5.save_checkpoint(model, CASE, deq_dir)
    tensors = load_file(os.path.join(deq_dir, "model.safetensors"))
    fp8, deq = {}, {}
    stats = dict(fp8_matrices=0, partial_block_matrices=0, unquantized_matrices=[])
    for name in sorted(tensors):
        t = tensors[name]
        if not is_fp8(name, t):
            fp8[name] = deq[name] = t.contiguous()
            if t.dim() == 2:
                stats["unquantized_matrices"].append(name)
            continue
        q, scale, full = mf.quantize(t.float(), "block")
        fp8[name] = q.contiguous()
        fp8[name[:-len("weight")] + "weight_scale_inv"] = scale.contiguous()
        deq[name] = mf.dequantize(q, full).contiguous()
        stats["fp8_matrices"] += 1
        stats["partial_block_matrices"] += int(t.shape[0] % mf.BLOCK != 0
                                               or t.shape[1] % mf.BLOCK != 0)
    save_file(deq, os.path.join(deq_dir, "model.safetensors"), metadata={"format": "pt"})
    os.makedirs(fp8_dir, exist_ok=True)
    save_file(fp8, os.path.join(fp8_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(deq_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = QUANT_CONFIG
    with open(os.path.join(fp8_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    kinds = sorted({n.split(".")[-2] for n in tensors if is_fp8(n, tensors[n])})
    stats["fp8_modules"] = kinds
    return stats


def main():
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    d = os.path.join(mg.GOLDEN, CASE["name"])
    for attempt in range(60):
        seed = CASE["seed"] + attempt
        if os.path.isdir(d):
            shutil.rmtree(d)
        with tempfile.TemporaryDirectory() as deq_dir:
            stats = build_pair(seed, d, deq_dir)
            g = torch.Generator().manual_seed(seed)
            prompt = torch.randint(0, 256, (CASE["prompt_len"],), generator=g).tolist()
            info = m5.record(CASE, deq_dir, seed, prompt)
        # make_goldens.py's 5e-3 for both margins (not make_goldens_glm5.py's 2e-4): the CUDA
        # case runs this fixture too, and its bf16 activations keep routes and selections only
        # above that (golden_test.cc's kBf16SafeGap).
        ok = (info["min_top2_gap"] > mg.MIN_TOP2_GAP and info["min_route_gap"] > DEVICE_SAFE_GAP
              and info["min_index_gap"] > DEVICE_SAFE_GAP and info["sparse_effect"] > 1e-3
              and len(set(info["greedy"])) >= 4)
        print(f"  seed {seed}: greedy {info['greedy']} top2 gap {info['min_top2_gap']:.4f} "
              f"route gap {info['min_route_gap']:.4f} index gap {info['min_index_gap']:.4f} "
              f"-> {'ok' if ok else 'reseed'}")
        if ok:
            break
    else:
        raise RuntimeError(f"no good seed for {CASE['name']}")
    assert info["indexer_types"] == ["full", "shared", "full", "shared"]
    assert info["mlp_layer_types"] == ["dense", "sparse", "sparse", "sparse"]
    info["np_diff"] = "not computed (GLM-5 has no numpy re-implementation; the C++ engine is it)"
    extra = dict(
        min_index_gap=round(info["min_index_gap"], 6), sparse_queries=info["sparse_queries"],
        sparse_selection_logit_effect=round(info["sparse_effect"], 6),
        indexer_types=info["indexer_types"], mlp_layer_types=info["mlp_layer_types"],
        fp8=dict(form="block", block=mf.BLOCK, subnormal_codes_per_matrix=len(mf.SUBNORMAL_CODES),
                 reference="dequantized fp32 checkpoint (q.float() * scale), Transformers fp32 "
                           "forward", **stats))
    mg.write_case(CASE, d, seed, prompt, info, extra)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"  {CASE['name']}: {stats['fp8_matrices']} FP8 matrices "
          f"({stats['partial_block_matrices']} with partial blocks), greedy {info['greedy']}, "
          f"size {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
