#!/usr/bin/env python3
"""The reference for FP8 on tensor cores: the FP8 fixtures' logits when every FP8 linear
layer's input is quantized on the fly, as the checkpoints' dynamic activation schemes say and
as the CUDA tensor-core path does (docs/cuda.md, "FP8 on tensor cores").
Run by hand, never by CI (torch + transformers, tools/requirements-goldens.txt):
    /tmp/gvenv/bin/python tools/make_goldens_fp8_tc.py
For fp8_block_fp32 and fp8_channel_fp32 (written by tools/make_goldens_fp8.py) it loads the
FP8 checkpoint dequantized in fp32 (q * scale, one rounding), runs Transformers'
Glm4MoeForCausalLM in fp32 on the prompt followed by the fixture's greedy tokens but the last
(so position n - 1 + k is teacher-forced decode step k), and replaces torch.nn.functional.linear
for the FP8 layers (not the head, not the router gates) with:
    x -> bf16 (the device's activations are bf16)
      -> per token and 128-wide K group (the last cut short): scale = amax / 448 over the
         group's finite values (at least FLT_MIN; 1 for an all-zero group),
         x' = e4m3(x / scale) * scale
      -> linear(x', W).
Writes into each fixture: tensor_cores.json (the scheme and the argmax of each of those
positions) and logits_tensor_cores.npy (float32 [prompt + greedy - 1, vocab]).

How far can an implementation land from this reference and still be right? e4m3 has 3
mantissa bits, so an input that moves by far less than a bf16 rounding can change its code,
and on these tiny random models such changes compound over the layers. The script measures
it: for each size r in PERTURB_SIZES, PERTURB_RUNS more runs in which each quantized input is
first multiplied by (1 + u), u uniform in [-r, r], one seed per run. 2^-9 is the size of a
bf16 rounding, which is how much the device's activations differ from the fp32 reference's;
2^-12 shows how little it takes. tensor_cores.json records the largest relative distance of
their prompt logits from the unperturbed run's (perturbed_prompt_logits_max), the median per
size, and, per step, whether every run of every size kept its token (stable_steps). The CUDA test holds the device to those: tokens at the stable steps, prompt
logits within the perturbed runs' spread.
Option --print-only prints the summary lines and writes nothing.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden")
GROUP = 128
E4M3_MAX = 448.0
PERTURB_RUNS = 16
PERTURB_SIZES = (2.0 ** -12, 2.0 ** -9)
SCHEME = ("e4m3 per token per 128-wide K group of the bf16-rounded input, scale amax / 448 "
          "(at least FLT_MIN, 1 for a zero group); weights dequantized in fp32; "
          "Transformers fp32 forward otherwise")


def dequantized_model(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.pop("quantization_config")
    t = load_file(os.path.join(d, "model.safetensors"))
    deq = {}
    for k, v in t.items():
        if k.endswith("weight_scale") or k.endswith("weight_scale_inv"):
            continue
        if v.dtype != torch.float8_e4m3fn:
            deq[k] = v.float()
            continue
        base = k[:-len("weight")]
        if base + "weight_scale" in t:  # per output channel
            full = t[base + "weight_scale"].float().expand(v.shape)
        else:  # 128x128 blocks cut short at the edges
            s = t[base + "weight_scale_inv"].float()
            full = s.repeat_interleave(GROUP, 0)[:v.shape[0]].repeat_interleave(GROUP, 1)[
                :, :v.shape[1]]
        deq[k] = v.float() * full
    model = Glm4MoeForCausalLM(Glm4MoeConfig(**cfg)).float().eval()
    # The eager experts (a loop of F.linear per expert), so that the hook below sees them.
    model.config._experts_implementation = "eager"
    names = model.state_dict().keys()
    for layer in range(cfg["num_hidden_layers"]):  # Transformers 5 fuses each layer's experts
        p = f"model.layers.{layer}.mlp.experts."
        if p + "gate_up_proj" not in names:
            continue
        experts = range(cfg["n_routed_experts"])
        deq[p + "gate_up_proj"] = torch.stack([torch.cat(
            [deq.pop(f"{p}{e}.gate_proj.weight"), deq.pop(f"{p}{e}.up_proj.weight")]) for e in experts])
        deq[p + "down_proj"] = torch.stack([deq.pop(f"{p}{e}.down_proj.weight") for e in experts])
    missing, unexpected = model.load_state_dict(deq, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model


def quantize_groups(x):
    x = x.to(torch.bfloat16).float()
    out = torch.empty_like(x)
    for c0 in range(0, x.shape[-1], GROUP):
        xs = x[..., c0:c0 + GROUP]
        a = xs.abs().where(torch.isfinite(xs), torch.zeros_like(xs)).amax(-1, keepdim=True)
        scale = torch.where(a > 0, torch.clamp(a / E4M3_MAX, min=torch.finfo(torch.float32).tiny),
                            torch.ones_like(a))
        q = (xs / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
        out[..., c0:c0 + GROUP] = q * scale
    return out


def forward(model, ids, skip, calls, seed=None, size=0.0):
    """Logits [positions, vocab] with every FP8 linear's input quantized; with a seed, each
    such input first multiplied by (1 + u), u uniform in [-size, size]."""
    linear = F.linear
    gen = torch.Generator().manual_seed(seed) if seed is not None else None

    def fp8_linear(x, w, b=None):
        if w.data_ptr() not in skip:
            if gen is not None:
                x = x * (1 + size * (2 * torch.rand(x.shape, generator=gen) - 1))
            x = quantize_groups(x)
            calls["quantized"] += 1
        return linear(x, w, b)

    F.linear = fp8_linear
    try:
        with torch.no_grad():
            return model(ids).logits[0].float()
    finally:
        F.linear = linear


def relative(a, b):
    return float((a - b).norm() / b.norm())


def run(name, write=True):
    d = os.path.join(GOLDEN, name)
    expected = json.load(open(os.path.join(d, "expected.json")))
    model = dequantized_model(d)
    skip = {model.lm_head.weight.data_ptr()} | {
        m.weight.data_ptr() for n, m in model.named_modules() if n.endswith("mlp.gate")}
    calls = {"quantized": 0}
    ids = torch.tensor([expected["prompt"] + expected["greedy"][:-1]])
    logits = forward(model, ids, skip, calls)
    # 7 per layer outside the routed experts (q/k/v/o, and the dense or shared FFN), and the
    # routed experts' gate_up and down for every expert some token chose.
    assert calls["quantized"] > 7 * model.config.num_hidden_layers, calls
    n = len(expected["prompt"])
    steps = logits[n - 1:].argmax(-1).tolist()
    top2 = logits[n - 1:].topk(2, -1).values
    distances, medians, stable = [], {}, [True] * len(steps)
    for size in PERTURB_SIZES:
        these = []
        for seed in range(1, PERTURB_RUNS + 1):
            p = forward(model, ids, skip, {"quantized": 0}, seed, size)
            these.append(relative(p[:n], logits[:n]))
            for k, t in enumerate(p[n - 1:].argmax(-1).tolist()):
                stable[k] = stable[k] and t == steps[k]
        medians[f"2^{round(math.log2(size))}"] = round(sorted(these)[len(these) // 2], 6)
        distances += these
    info = dict(scheme=SCHEME, quantized_linear_calls=calls["quantized"], steps=steps,
                reference_greedy=expected["greedy"],
                min_top2_gap=round(float((top2[:, 0] - top2[:, 1]).min()), 6),
                perturbation=dict(relative_sizes=list(PERTURB_SIZES), runs_per_size=PERTURB_RUNS),
                perturbed_prompt_logits_max=round(max(distances), 6),
                perturbed_prompt_logits_median=medians,
                stable_steps=stable)
    if write:
        with open(os.path.join(d, "tensor_cores.json"), "w") as f:
            json.dump(info, f, indent=2)
        np.save(os.path.join(d, "logits_tensor_cores.npy"), logits.numpy().astype(np.float32))
    print(f"{name}: steps {steps} (unquantized reference {expected['greedy']}), "
          f"min top-2 gap {info['min_top2_gap']}, {calls['quantized']} quantized linears; "
          f"{PERTURB_RUNS} perturbed runs per size: prompt logits "
          f"{info['perturbed_prompt_logits_median']} (median per size) to "
          f"{info['perturbed_prompt_logits_max']} (max) away, stable steps {stable}")


def main():
    write = True
    for arg in sys.argv[1:]:
        if arg != "--print-only":
            sys.exit(f"unknown argument {arg}: only --print-only")
        write = False
    torch.set_num_threads(1)
    for name in ("fp8_block_fp32", "fp8_channel_fp32"):
        run(name, write)


if __name__ == "__main__":
    sys.exit(main())
