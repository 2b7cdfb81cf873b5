#!/usr/bin/env python3
"""Memory sizing for GLM-4.5-family and GLM-5 checkpoints: parameters, bf16 weight bytes, KV
cache bytes per token, and how many GPUs of a kind hold them. Standard library only.

    tools/model_sizing.py                        # GLM-4.5, GLM-4.5-Air, GLM-5 (released configs)
                                                 # (each also in its FP8 release's form)
    tools/model_sizing.py /models/model/config.json --kv_tokens=65536

Counts every tensor of the Hugging Face checkpoint (docs/operations.md explains the formulas):
per layer q/k/v/o (+ biases, + QK-norm gains), two RMSNorm gains, and either the dense SwiGLU
MLP or the MoE block (router, fp32 correction bias, routed experts, shared experts); plus
embeddings, final norm and lm_head (unless tied), and the MTP layer(s) counted separately
(glm-server does not load them). GLM-5 (model_type glm_moe_dsa, docs/glm5.md) replaces q/k/v/o
with the latent attention's projections and norms, plus the DSA indexer on "full" layers
(its weights_proj stays fp32), and its KV cache holds one latent row per token and layer.
"""
import argparse
import json
import math

# The released config.json values (docs/model.md, "Released shapes").
PRESETS = {
    "GLM-4.5": dict(hidden_size=5120, num_hidden_layers=92, num_attention_heads=96,
                    num_key_value_heads=8, head_dim=128, use_qk_norm=True, attention_bias=True,
                    intermediate_size=12288, moe_intermediate_size=1536, n_routed_experts=160,
                    n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3,
                    vocab_size=151552, tie_word_embeddings=False, num_nextn_predict_layers=1),
    "GLM-4.5-Air": dict(hidden_size=4096, num_hidden_layers=46, num_attention_heads=96,
                        num_key_value_heads=8, head_dim=128, use_qk_norm=False,
                        attention_bias=True, intermediate_size=10944,
                        moe_intermediate_size=1408, n_routed_experts=128, n_shared_experts=1,
                        num_experts_per_tok=8, first_k_dense_replace=1, vocab_size=151552,
                        tie_word_embeddings=False, num_nextn_predict_layers=1),
    "GLM-5": dict(model_type="glm_moe_dsa", hidden_size=6144, num_hidden_layers=78,
                  num_attention_heads=64, num_key_value_heads=64, q_lora_rank=2048,
                  kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
                  index_n_heads=32, index_head_dim=128, index_topk=2048,
                  intermediate_size=12288, moe_intermediate_size=2048, n_routed_experts=256,
                  n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3,
                  vocab_size=154880, tie_word_embeddings=False, num_nextn_predict_layers=1),
}

# GlmMoeDsaConfig's defaults (GLM-5), for fields a glm_moe_dsa config.json leaves out.
DEFAULTS_GLM5 = dict(PRESETS["GLM-5"], num_nextn_predict_layers=0)

# Glm4MoeConfig's defaults, for fields a config.json leaves out.
DEFAULTS = dict(hidden_size=4096, num_hidden_layers=46, num_attention_heads=96,
                num_key_value_heads=8, use_qk_norm=False, attention_bias=False,
                intermediate_size=10944, moe_intermediate_size=1408, n_routed_experts=128,
                n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=1,
                vocab_size=151552, tie_word_embeddings=False, num_nextn_predict_layers=0)

# GPU memory as nvidia-smi reports it (memory.total, MiB).
GPUS = {"H100 80GB": 81559, "H200 141GB": 143771}

GIB = 1024**3


def is_glm5(c):
    return c.get("model_type") == "glm_moe_dsa"


def indexer_types(c):
    """GLM-5's per-layer "full"/"shared", as GlmMoeDsaConfig derives it."""
    if c.get("indexer_types"):
        return list(c["indexer_types"])
    pattern = c.get("index_topk_pattern")
    if isinstance(pattern, str):
        return ["full" if ch == "F" else "shared" for ch in pattern]
    freq = max(c.get("index_topk_freq", 1), 1)
    offset = c.get("index_skip_topk_offset", 2)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared"
            for i in range(c["num_hidden_layers"])]


def attn_params(c):
    """Attention parameters of one layer: (bf16, fp32 kept, extra bf16 and fp32 of an indexer)."""
    h, nh = c["hidden_size"], c["num_attention_heads"]
    if is_glm5(c):
        q, r, dn, dr, dv = (c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"],
                            c["qk_rope_head_dim"], c["v_head_dim"])
        # q_a (+ norm), q_b, kv_a_proj_with_mqa (+ norm), kv_b, o
        attn = h * q + q + q * nh * (dn + dr) + h * (r + dr) + r + r * nh * (dn + dv) + nh * dv * h
        hi, di = c["index_n_heads"], c["index_head_dim"]
        # wq_b, wk, k_norm weight and bias; weights_proj [hi, h] is kept fp32
        return attn, q * hi * di + h * di + 2 * di, h * hi
    kv, hd = c["num_key_value_heads"], c["head_dim"]
    attn = h * nh * hd + 2 * h * kv * hd + nh * hd * h  # q, k, v, o
    if c.get("attention_bias", False):
        attn += nh * hd + 2 * kv * hd
    if c.get("use_qk_norm", False):
        attn += 2 * hd
    return attn, 0, 0


def count(c):
    """Returns (bf16 parameters, fp32 parameters, active bf16 parameters per token) of the
    served model, and the same three for the MTP layers."""
    h = c["hidden_size"]
    e, im, ns, k = (c["n_routed_experts"], c["moe_intermediate_size"], c["n_shared_experts"],
                    c["num_experts_per_tok"])
    attn, index_bf16, index_fp32 = attn_params(c)
    n_full = indexer_types(c).count("full") if is_glm5(c) else 0
    norms = 2 * h
    dense = 3 * h * c["intermediate_size"]
    expert = 3 * h * im
    moe_bf16 = e * h + e * expert + ns * expert  # router, routed experts, shared experts
    moe_fp32 = e  # e_score_correction_bias
    moe_active = e * h + k * expert + ns * expert

    layers = c["num_hidden_layers"]
    if c.get("mlp_layer_types"):
        n_dense = c["mlp_layer_types"].count("dense")
    else:
        n_dense = min(c["first_k_dense_replace"], layers)
    n_moe = layers - n_dense
    embed = c["vocab_size"] * h
    head = 0 if c.get("tie_word_embeddings", False) else c["vocab_size"] * h
    bf16 = embed + head + h + n_dense * (attn + norms + dense) + n_moe * (attn + norms + moe_bf16)
    fp32 = n_moe * moe_fp32
    active = head + n_dense * (attn + dense) + n_moe * (attn + moe_active)
    bf16 += n_full * index_bf16
    fp32 += n_full * index_fp32
    active += n_full * (index_bf16 + index_fp32)
    # MTP layer: an MoE block plus enorm, hnorm, eh_proj [h, 2h], shared_head norm and head.
    mtp = c.get("num_nextn_predict_layers", 0)
    mtp_bf16 = mtp * (attn + index_bf16 + norms + moe_bf16 + 2 * h + 2 * h * h + h
                      + c["vocab_size"] * h)
    mtp_fp32 = mtp * (moe_fp32 + index_fp32)
    return bf16, fp32, active, mtp_bf16, mtp_fp32


def fp8_matrices(c):
    """(rows, cols, count) of every matrix the FP8 releases store in e4m3 (docs/fp8.md): all
    linear layers of the served layers except the router gates, GLM-5's indexer weights_proj,
    the embedding and the head (kept bf16/fp32, as the releases' ignore lists say)."""
    h, nh, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    out = []
    if is_glm5(c):
        q, r, dn, dr, dv = (c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"],
                            c["qk_rope_head_dim"], c["v_head_dim"])
        out += [(q, h, layers), (nh * (dn + dr), q, layers), (r + dr, h, layers),
                (nh * (dn + dv), r, layers), (h, nh * dv, layers)]
        n_full = indexer_types(c).count("full")
        out += [(c["index_n_heads"] * c["index_head_dim"], q, n_full),
                (c["index_head_dim"], h, n_full)]
    else:
        kv, hd = c["num_key_value_heads"], c["head_dim"]
        out += [(nh * hd, h, layers), (kv * hd, h, 2 * layers), (h, nh * hd, layers)]
    if c.get("mlp_layer_types"):
        n_dense = c["mlp_layer_types"].count("dense")
    else:
        n_dense = min(c["first_k_dense_replace"], layers)
    i, im = c["intermediate_size"], c["moe_intermediate_size"]
    per_moe = c["n_routed_experts"] + c["n_shared_experts"]
    out += [(i, h, 2 * n_dense), (h, i, n_dense),
            (im, h, 2 * per_moe * (layers - n_dense)), (h, im, per_moe * (layers - n_dense))]
    return out


def fp8_weight_bytes(c, block):
    """Served weight bytes of the FP8 form: e4m3 matrices (one byte per weight) with fp32
    scales per block x block (GLM-5-FP8, quant_method fp8) or per output row (block None:
    GLM-4.5-FP8's compressed-tensors channel scales), the rest as in weight_bytes()."""
    bf16, fp32, *_ = count(c)
    quantized = scales = 0
    for rows, cols, n in fp8_matrices(c):
        quantized += n * rows * cols
        scales += n * (rows if block is None else -(-rows // block) * -(-cols // block))
    return 2 * (bf16 - quantized) + 4 * fp32 + quantized + 4 * scales, quantized, scales


def kv_bytes_per_token(c, dtype_bytes):
    if is_glm5(c):
        # One latent row per layer: the normed latent, the rotary key and (when any layer has
        # an indexer) the indexer key; core/cpu/ops/mla.h.
        row = c["kv_lora_rank"] + c["qk_rope_head_dim"]
        if "full" in indexer_types(c):
            row += c["index_head_dim"]
        return c["num_hidden_layers"] * row * dtype_bytes
    # K and V, every layer, every KV head, head_dim values each.
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * dtype_bytes


def report(name, c, kv_tokens):
    bf16, fp32, active, mtp_bf16, mtp_fp32 = count(c)
    weights = 2 * bf16 + 4 * fp32
    ckpt = weights + 2 * mtp_bf16 + 4 * mtp_fp32
    kv_gpu = kv_bytes_per_token(c, 2)  # bf16 KV on the GPU
    kv_cpu = kv_bytes_per_token(c, 4)  # fp32 KV on the CPU backend
    print(f"## {name}")
    print(f"parameters (served, without MTP): {bf16 + fp32:,} ({(bf16 + fp32) / 1e9:.2f} B); "
          f"active per token: {active / 1e9:.2f} B")
    print(f"MTP layer parameters (loaded with the whole model for speculative decoding, "
          f"docs/mtp.md): {mtp_bf16 + mtp_fp32:,}")
    print(f"weights in bf16 (fp32 router bias): {weights:,} bytes = {weights / 1e9:.1f} GB = "
          f"{weights / GIB:.1f} GiB")
    print(f"checkpoint on disk with MTP: {ckpt / 1e9:.1f} GB = {ckpt / GIB:.1f} GiB")
    block = 128 if is_glm5(c) else None  # the forms of GLM-5-FP8 and GLM-4.5(-Air)-FP8
    fp8, quantized, scales = fp8_weight_bytes(c, block)
    print(f"weights in FP8 ({'128x128 block' if block else 'per-channel'} fp32 scales; "
          f"{quantized / 1e9:.2f} B e4m3 weights, {scales:,} scales): {fp8:,} bytes = "
          f"{fp8 / 1e9:.1f} GB = {fp8 / GIB:.1f} GiB")
    print(f"KV per token: GPU bf16 {kv_gpu:,} bytes ({kv_gpu / 1024:.0f} KiB); "
          f"CPU fp32 {kv_cpu:,} bytes ({kv_cpu / 1024:.0f} KiB)")
    print(f"KV for {kv_tokens} tokens: GPU {kv_gpu * kv_tokens / GIB:.1f} GiB, "
          f"CPU {kv_cpu * kv_tokens / GIB:.1f} GiB")
    print(f"CPU backend host memory (weights + KV): "
          f"{(weights + kv_cpu * kv_tokens) / GIB:.1f} GiB")
    need = weights + kv_gpu * kv_tokens
    _, index_bf16, index_fp32 = attn_params(c)
    # the largest (MoE) layer, bytes
    layer = 2 * (layer_params(c) + index_bf16) + 4 * (c["n_routed_experts"] + index_fp32)
    kv_layer = kv_gpu // c["num_hidden_layers"] * kv_tokens
    edge = 2 * c["vocab_size"] * c["hidden_size"]  # embedding (first stage) or lm_head (last)
    print(f"one MoE layer: {layer / 1e9:.2f} GB of weights + {kv_layer / GIB:.2f} GiB of KV "
          f"({kv_tokens} tokens); embedding and lm_head: {edge / 1e9:.2f} GB each")
    for gpu, mib in GPUS.items():
        total = mib * 1024**2
        usable = 0.9 * total  # CUDA context, cuBLAS workspace, activation arena, fragmentation
        n = math.ceil(need / usable)
        pow2 = 1 << (n - 1).bit_length()
        print(f"{gpu} ({total / GIB:.1f} GiB): weights + KV need {need / GIB:.1f} GiB -> "
              f"{need / total:.2f} GPUs of memory; at 90% usable: {n} "
              f"(tensor/expert parallel groups are powers of two: {pow2})")
        print(f"{gpu}: the largest model served whole by one process on one GPU, with this "
              f"KV cache: {(usable - kv_gpu * kv_tokens) / 2 / 1e9:.1f} B parameters in bf16")
        per_stage = int((usable - edge) // (layer + kv_layer))
        stages = math.ceil(c["num_hidden_layers"] / per_stage)
        print(f"{gpu}, one process per GPU today: a --layers span of at most {per_stage} layers "
              f"per GPU -> {stages} pipeline stages (Forward only; Generate needs the whole "
              f"model in one process)")
    print()


def layer_params(c):
    """bf16 parameters of one MoE decoder layer (attention, norms, router, experts; without a
    GLM-5 indexer)."""
    h = c["hidden_size"]
    attn = attn_params(c)[0]
    expert = 3 * h * c["moe_intermediate_size"]
    return (attn + 2 * h + c["n_routed_experts"] * h + c["n_routed_experts"] * expert
            + c["n_shared_experts"] * expert)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("config", nargs="?", help="a config.json (default: the released presets)")
    p.add_argument("--kv_tokens", type=int, default=32768,
                   help="KV cache capacity in tokens (glm-server --kv_capacity_tokens; default "
                        "32768, the engine's default)")
    a = p.parse_args()
    if a.config:
        with open(a.config) as f:
            raw = json.load(f)
        # The formulas are Glm4MoeForCausalLM's: any other architecture (a Llama config, say)
        # would silently fill in GLM-4.5-Air's defaults and print nonsense.
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        if model_type not in ("glm4_moe", "glm_moe_dsa"):
            p.error(f"{a.config}: model_type is {model_type!r}, not 'glm4_moe' or 'glm_moe_dsa': "
                    "this tool sizes GLM-4.5-family (Glm4MoeForCausalLM) and GLM-5 "
                    "(GlmMoeDsaForCausalLM) checkpoints only")
        c = dict(DEFAULTS_GLM5 if model_type == "glm_moe_dsa" else DEFAULTS, **raw)
        if c.get("head_dim") is None:
            c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
        report(a.config, c, a.kv_tokens)
    else:
        for name, c in PRESETS.items():
            report(name, c, a.kv_tokens)


if __name__ == "__main__":
    main()
