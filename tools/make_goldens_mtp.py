#!/usr/bin/env python3
"""Build the MTP-layer golden fixtures in tests/golden/mtp_* (docs/mtp.md).

Transformers does not run the MTP layer, so the reference here is the published formula
written with Transformers' own pieces (run by hand, never by CI; tools/requirements-goldens.txt):

    /tmp/gvenv/bin/python tools/make_goldens_mtp.py            # all cases (venv: tools/make_goldens.py)

For each case a tiny random model of N + 1 decoder layers is built with Transformers
(Glm4MoeForCausalLM or GlmMoeDsaForCausalLM, weights by make_goldens.py's overwrite_weights);
its layer N becomes the MTP layer's decoder block, stored as model.layers.N.* beside the MTP
layer's own tensors (enorm, hnorm, eh_proj, shared_head.norm, and for the GLM-4.5 cases
shared_head.head), all random; config.json says num_hidden_layers N, num_nextn_predict_layers 1.
FP8 cases quantize every linear matrix of the model and of the MTP decoder block as
make_goldens_fp8.py does (128x128 blocks, weight_scale_inv), eh_proj and shared_head.head kept
fp32 (modules_to_not_convert), and the reference runs the dequantized values.

The reference, on the prompt ids t[0..T):
  h = model.model(t).last_hidden_state                  the final-normed hidden states [T, H]
  e = embed(t[1:]); e[0] = 0                             the next tokens; position 0 zeroed
  x = eh_proj(cat(enorm(e), hnorm(h[:-1])))              [T - 1, H]
  mtp_logits = M(inputs_embeds=x)                        [T - 1, V]
where M is a ONE-layer model of the same Transformers class (its layer 0 the stored MTP block:
MoE, and for GLM-5 an indexer of its own) with model.norm = shared_head.norm and lm_head =
shared_head.head (else the model's lm_head): Transformers' decoder layer, RoPE at positions
0..T-2, causal mask and head, nothing of ours. Outputs per case: the checkpoint, logits.npy
(the model's [T, V]), mtp_logits.npy, mtp.json (prompt, seed, provenance; not named expected.json: these are
not the standard fixtures the golden tests enumerate).
"""

import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM, GlmMoeDsaConfig, GlmMoeDsaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402
import make_goldens_fp8 as mf  # noqa: E402
import make_goldens_glm5 as m5  # noqa: E402

GLM45 = dict(vocab_size=128, hidden_size=64, head_dim=16, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=16,
             n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
             topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
             first_k_dense_replace=1, use_qk_norm=True, attention_bias=True,
             partial_rotary_factor=0.5, rope_theta=10000.0, max_position_embeddings=512,
             rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=None,
             bos_token_id=None, eos_token_id=None)

# The FP8 case's widths are not multiples of 128: every matrix has partial edge blocks.
GLM45_FP8 = dict(GLM45, vocab_size=128, hidden_size=160, head_dim=40, intermediate_size=136,
                 moe_intermediate_size=32, n_routed_experts=4)

CASES = [
    dict(name="mtp_glm45_fp32", arch="glm45", shape=GLM45, layers=2, fp8=False,
         stored_head=True, seed=30001, prompt_len=12,
         description="GLM-4.5 shapes (GQA 4/2, QK-norm, biases, partial RoPE), 2 layers (dense, "
                     "MoE) + the MTP layer (MoE, top-2 of 8, shared expert), shared_head.head "
                     "stored, fp32."),
    dict(name="mtp_glm45_fp8_block", arch="glm45", shape=GLM45_FP8, layers=1, fp8=True,
         stored_head=False, seed=30101, prompt_len=12,
         description="GLM-4.5 in block-scaled FP8 (quant_method fp8, 128x128 weight_scale_inv; "
                     "hidden 160, widths 136 and 32: partial edge blocks), 1 dense layer + the "
                     "MTP layer (top-2 of 4), its matrices FP8 too, eh_proj fp32; the MTP layer "
                     "reads the model's lm_head."),
    dict(name="mtp_glm5_fp32", arch="glm5", layers=2, fp8=False, stored_head=False, seed=30201,
         prompt_len=16,
         description="GLM-5 shapes (MLA, DSA indexer, index_topk 8 with a 16-token prompt), 2 "
                     "layers (full, shared indexer) + the MTP layer with its own indexer, fp32."),
    dict(name="mtp_glm5_fp8_block", arch="glm5", layers=1, fp8=True, stored_head=False,
         seed=30301, prompt_len=16,
         description="As mtp_glm5_fp32 in block-scaled FP8 (indexer weights_proj, eh_proj and "
                     "the head unquantized)."),
]


def configs(case, layers):
    """(config class, model class, kwargs) for a model of `layers` layers."""
    if case["arch"] == "glm45":
        return Glm4MoeConfig, Glm4MoeForCausalLM, dict(case["shape"], num_hidden_layers=layers)
    kw = dict(m5.COMMON, num_hidden_layers=layers, vocab_size=128)
    kw["indexer_types"] = (["full", "shared"] * layers)[:layers]
    kw["mlp_layer_types"] = (["dense"] + ["sparse"] * layers)[:layers]
    return GlmMoeDsaConfig, GlmMoeDsaForCausalLM, kw


def build(case, seed):
    """A state dict of the N-layer model plus the MTP layer, and the N-layer config dict."""
    n = case["layers"]
    cfg_cls, model_cls, kw = configs(case, n + 1)
    if case["arch"] == "glm5":
        kw["indexer_types"][n] = "full"  # the MTP layer keeps its own indexer
    torch.manual_seed(seed)
    big = model_cls(cfg_cls(**kw)).eval()
    mg.overwrite_weights(big, seed, m5.SCALE if case["arch"] == "glm5" else None)
    sd = {k: v.detach().clone().float() for k, v in big.state_dict().items()}
    g = torch.Generator().manual_seed(seed + 7)
    h, v = kw["hidden_size"], kw["vocab_size"]
    p = f"model.layers.{n}."
    sd[p + "enorm.weight"] = torch.randn(h, generator=g) * 0.2 + 1.0
    sd[p + "hnorm.weight"] = torch.randn(h, generator=g) * 0.2 + 1.0
    sd[p + "eh_proj.weight"] = torch.randn(h, 2 * h, generator=g) * 0.08
    sd[p + "shared_head.norm.weight"] = torch.randn(h, generator=g) * 0.2 + 1.0
    if case["stored_head"]:
        sd[p + "shared_head.head.weight"] = torch.randn(v, h, generator=g) * 0.35
    _, _, small = configs(case, n)
    small["num_nextn_predict_layers"] = 1
    cfg = cfg_cls(**small).to_dict()
    return sd, cfg


def quantizable(name, t):
    if t.dim() != 2 or not name.endswith(".weight"):
        return False
    skip = ("model.embed_tokens.weight", "lm_head.weight")
    return not (name in skip or name.endswith("mlp.gate.weight") or "eh_proj" in name
                or "shared_head" in name or name.endswith("indexer.weights_proj.weight"))


def write(case, sd, cfg, d):
    """The checkpoint (FP8 where the case says) in d; returns the values the reference uses."""
    os.makedirs(d, exist_ok=True)
    stored, ref = {}, {}
    for name in sorted(sd):
        t = sd[name].contiguous()
        if not (case["fp8"] and quantizable(name, t)):
            stored[name] = ref[name] = t
            continue
        q, scale, full = mf.quantize(t, "block")
        stored[name] = q.contiguous()
        stored[name[:-len("weight")] + "weight_scale_inv"] = scale.contiguous()
        ref[name] = mf.dequantize(q, full).contiguous()
    save_file(stored, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(cfg)
    for k in ("transformers_version", "dtype", "torch_dtype", "architectures"):
        cfg.pop(k, None)
    cfg["architectures"] = ["Glm4MoeForCausalLM" if case["arch"] == "glm45"
                            else "GlmMoeDsaForCausalLM"]
    cfg["dtype"] = "float32"
    if case["fp8"]:
        cfg["quantization_config"] = {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [mf.BLOCK, mf.BLOCK],
            "modules_to_not_convert": ["lm_head", "mlp.gate", "eh_proj", "shared_head",
                                       "indexer.weights_proj"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    return ref


@torch.no_grad()
def reference(case, ref, prompt):
    n = case["layers"]
    cfg_cls, model_cls, kw = configs(case, n)
    main = model_cls(cfg_cls(**kw)).eval()
    main_sd = {k: v for k, v in ref.items() if not k.startswith(f"model.layers.{n}.")}
    missing, unexpected = main.load_state_dict(main_sd, strict=False)
    assert not unexpected and all("e_score_correction_bias" not in m for m in missing), \
        (missing, unexpected)
    ids = torch.tensor([prompt])
    out = main.model(input_ids=ids)
    h = out.last_hidden_state[0]
    logits = main.lm_head(h)

    # The MTP block as a one-layer model of the same class.
    one = dict(kw, num_hidden_layers=1, first_k_dense_replace=0)
    if case["arch"] == "glm5":
        one["indexer_types"] = ["full"]
        one["mlp_layer_types"] = ["sparse"]
    mtp = model_cls(cfg_cls(**one)).eval()
    p = f"model.layers.{n}."
    msd = {("model.layers.0." + k[len(p):]): v for k, v in ref.items() if k.startswith(p)
           and not k[len(p):].startswith(("enorm", "hnorm", "eh_proj", "shared_head"))}
    msd["model.norm.weight"] = ref[p + "shared_head.norm.weight"]
    msd["lm_head.weight"] = ref.get(p + "shared_head.head.weight", ref["lm_head.weight"])
    msd["model.embed_tokens.weight"] = ref["model.embed_tokens.weight"]
    missing, unexpected = mtp.load_state_dict(msd, strict=False)
    assert not unexpected and not [m for m in missing if "e_score_correction_bias" not in m], \
        (missing, unexpected)
    # Buffers (the correction bias) load through load_state_dict as well; check it did.
    for name, b in mtp.named_buffers():
        if name.endswith("e_score_correction_bias"):
            assert torch.equal(b, ref[p + name[len("model.layers.0."):]])

    def rms(x, w):
        x = x.float()
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + kw["rms_norm_eps"]))

    e = main.model.embed_tokens(ids[0, 1:]).clone()
    e[0] = 0  # the pair at position 0
    x = torch.cat([rms(e, ref[p + "enorm.weight"]), rms(h[:-1], ref[p + "hnorm.weight"])], -1)
    x = x @ ref[p + "eh_proj.weight"].T
    mtp_logits = mtp(inputs_embeds=x.unsqueeze(0), use_cache=False).logits[0]
    return logits.float().numpy(), mtp_logits.float().numpy()


def run_case(case):
    d = os.path.join(mg.GOLDEN, case["name"])
    if os.path.isdir(d):
        shutil.rmtree(d)
    seed = case["seed"]
    sd, cfg = build(case, seed)
    ref = write(case, sd, cfg, d)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg["vocab_size"], (case["prompt_len"],), generator=g).tolist()
    logits, mtp_logits = reference(case, ref, prompt)
    mg.save_npy(os.path.join(d, "logits.npy"), logits)
    mg.save_npy(os.path.join(d, "mtp_logits.npy"), mtp_logits)
    expected = dict(
        description=case["description"], seed=seed, prompt=prompt,
        mtp_pairs="row i: the MTP layer at position i over (prompt[i + 1], h[i]); predicts "
                  "prompt[i + 2]",
        generator="tools/make_goldens_mtp.py", transformers=transformers.__version__,
        torch=torch.__version__)
    with open(os.path.join(d, "mtp.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{case['name']}: logits {logits.shape}, mtp {mtp_logits.shape}, {size / 1024:.0f} KiB")


def main():
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    only = sys.argv[1:]
    for case in CASES:
        if not only or case["name"] in only:
            run_case(case)


if __name__ == "__main__":
    main()
