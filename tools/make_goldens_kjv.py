#!/usr/bin/env python3
"""Golden fixtures of the embedded default model glm-4.5-kjv, from the references (run by hand).

Transformers' Glm4MoeForCausalLM loads the committed checkpoint (from_pretrained, fp32 compute
of the bf16 weights, eager attention: glmserve's exact mode computes the same) and gives
  * prompt.json / prompt_logits.npy: a chat prompt's ids and its logits [T, vocab], and the
    greedy continuation (64 tokens, no stop);
  * perplexity.json: the held-out text's (tests/golden/kjv/heldout.txt) token count and mean
    negative log-likelihood, cut into windows of WINDOW tokens as core/engine/scoring.h cuts
    them, log-softmax in float64;
and the MTP layer's reference (tools/train_default_model.py's MtpLayer, the published formula;
Transformers does not run it):
  * mtp_logits.npy: the MTP layer's logits [T-1, vocab] for the prompt (row i pairs token i+1
    with the main model's hidden state at i, position i);
  * mtp_acceptance.json: greedy speculative decoding simulated on held-out prompts at k = 1, 2,
    3 drafted tokens: mean acceptance length (accepted drafts + 1 per verify step) and the
    acceptance rate of each draft position.

    V/bin/python tools/make_goldens_kjv.py [--model models/glm-4.5-kjv] [--out tests/golden/kjv]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import Glm4MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
import train_default_model as train  # noqa: E402  (the MTP layer's reference)

WINDOW = 256
PROMPT = "[gMASK]<sop><|user|>\nHello! What can you do?<|assistant|>"
ACCEPT_PROMPTS, ACCEPT_PROMPT_TOKENS, ACCEPT_NEW_TOKENS = 24, 48, 64


def load(model_dir):
    model = Glm4MoeForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    model = model.float().eval()
    cfg = model.config
    mtp = train.MtpLayer(cfg)
    prefix = f"model.layers.{cfg.num_hidden_layers}."
    stored = {k[len(prefix):]: v.float() for k, v in
              load_file(os.path.join(model_dir, "model.safetensors")).items()
              if k.startswith(prefix)}
    assert "shared_head.head.weight" not in stored  # the model's lm_head is the MTP head
    layer = {}
    E = cfg.n_routed_experts
    for k, v in stored.items():
        if k.startswith("mlp.experts."):
            continue
        if k in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"):
            continue
        layer[k] = v
    layer["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([stored[f"mlp.experts.{e}.gate_proj.weight"],
                    stored[f"mlp.experts.{e}.up_proj.weight"]]) for e in range(E)])
    layer["mlp.experts.down_proj"] = torch.stack(
        [stored[f"mlp.experts.{e}.down_proj.weight"] for e in range(E)])
    mtp.layer.load_state_dict(layer, strict=True)
    mtp.enorm.weight.data.copy_(stored["enorm.weight"])
    mtp.hnorm.weight.data.copy_(stored["hnorm.weight"])
    mtp.eh_proj.weight.data.copy_(stored["eh_proj.weight"])
    mtp.shared_head_norm.weight.data.copy_(stored["shared_head.norm.weight"])
    return model, mtp.eval()


@torch.no_grad()
def main_forward(model, ids):
    """Logits [T, V] and the final normed hidden states [T, H] of a no-cache forward."""
    h = model.model(input_ids=torch.tensor([ids])).last_hidden_state
    return model.lm_head(h)[0], h[0]


@torch.no_grad()
def mtp_forward(model, mtp, next_ids, hidden):
    """The MTP layer over pairs (next_ids[i], hidden[i]) at positions 0..n-1: normed outputs."""
    n = len(next_ids)
    pos = torch.arange(n).unsqueeze(0)
    out = mtp(model, torch.tensor([next_ids]), hidden.unsqueeze(0), pos, train.causal_mask(n))
    return out[0]


def nll_windows(model, ids):
    total, predicted = 0.0, 0
    for b in range(0, len(ids), WINDOW):
        w = ids[b:b + WINDOW]
        logits, _ = main_forward(model, w)
        lp = torch.log_softmax(logits.double(), dim=-1)
        total += -lp[torch.arange(len(w) - 1), torch.tensor(w[1:])].sum().item()
        predicted += len(w) - 1
    return total, predicted


@torch.no_grad()
def greedy(model, ids, n):
    out = list(ids)
    for _ in range(n):
        logits, _ = main_forward(model, out)
        out.append(int(torch.argmax(logits[-1]).item()))
    return out[len(ids):]


@torch.no_grad()
def acceptance(model, mtp, prompts, k):
    """Greedy speculation with k MTP drafts a step against the target's greedy continuation."""
    lengths, accepted_at = [], [0] * k
    for prompt in prompts:
        target = prompt + greedy(model, prompt, ACCEPT_NEW_TOKENS)
        _, hidden = main_forward(model, target)
        n = len(prompt)  # target[n] is the token the first verify step produced
        while n < len(target) - 1:
            # The MTP layer's context: pairs (target[i + 1], hidden[i]) for i < n, verified.
            next_ids, hs = list(target[1:n + 1]), hidden[:n]
            drafts = []
            for _ in range(k):
                out = mtp_forward(model, mtp, next_ids, hs)
                d = int(torch.argmax(model.lm_head(out[-1])).item())
                drafts.append(d)
                next_ids.append(d)
                hs = torch.cat([hs, out[-1:]])  # chained: the draft's own output hidden state
            a = 0
            while a < k and n + 1 + a < len(target) and drafts[a] == target[n + 1 + a]:
                accepted_at[a] += 1
                a += 1
            lengths.append(a + 1)
            n += a + 1
    steps = len(lengths)
    return {"mean_acceptance_length": round(sum(lengths) / steps, 4), "verify_steps": steps,
            "accepted_at_draft": accepted_at,
            "acceptance_rate_at_draft": [round(x / steps, 4) for x in accepted_at]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "glm-4.5-kjv"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "kjv"))
    ap.add_argument("--skip_acceptance", action="store_true", help="only the Transformers files")
    args = ap.parse_args()
    torch.set_num_threads(2)
    model, mtp = load(args.model)
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    os.makedirs(args.out, exist_ok=True)

    ids = tok.encode(PROMPT, add_special_tokens=False).ids
    logits, hidden = main_forward(model, ids)
    np.save(os.path.join(args.out, "prompt_logits.npy"), logits.numpy().astype(np.float32))
    mtp_out = mtp_forward(model, mtp, ids[1:], hidden[:-1])
    np.save(os.path.join(args.out, "mtp_logits.npy"),
            model.lm_head(mtp_out).detach().numpy().astype(np.float32))
    cont = greedy(model, ids, 64)
    with open(os.path.join(args.out, "prompt.json"), "w") as f:
        json.dump({"text": PROMPT, "ids": ids, "greedy_64": cont,
                   "greedy_text": tok.decode(cont, skip_special_tokens=False)}, f, indent=1,
                  ensure_ascii=False)
    print("prompt reply:", repr(tok.decode(cont, skip_special_tokens=False)))

    with open(os.path.join(args.out, "heldout.txt"), encoding="utf-8") as f:
        held = tok.encode(f.read(), add_special_tokens=False).ids
    total, predicted = nll_windows(model, held)
    ppl = {"window": WINDOW, "tokens": len(held), "predicted": predicted,
           "mean_nll": total / predicted, "perplexity": math.exp(total / predicted)}
    with open(os.path.join(args.out, "perplexity.json"), "w") as f:
        json.dump(ppl, f, indent=1)
    print("held-out:", ppl)

    if args.skip_acceptance:
        return
    # Acceptance prompts: the starts of held-out windows (tests/golden/kjv/heldout.txt is the
    # first three held-out chapters; these come from all of them).
    chapters = train.read_kjv()
    _, held_chapters = train.split_chapters(chapters)
    text_ids = tok.encode("".join(train.chapter_text(*c) for c in held_chapters),
                          add_special_tokens=False).ids
    stride = len(text_ids) // ACCEPT_PROMPTS
    prompts = [text_ids[i * stride:i * stride + ACCEPT_PROMPT_TOKENS]
               for i in range(ACCEPT_PROMPTS)]
    acc = {"prompts": ACCEPT_PROMPTS, "prompt_tokens": ACCEPT_PROMPT_TOKENS,
           "new_tokens": ACCEPT_NEW_TOKENS,
           "chained_hidden": "the draft's shared_head.norm output (the vector the head reads)"}
    for k in (1, 2, 3):
        acc[f"k{k}"] = acceptance(model, mtp, prompts, k)
        print(f"k={k}:", acc[f"k{k}"])
    with open(os.path.join(args.out, "mtp_acceptance.json"), "w") as f:
        json.dump(acc, f, indent=1)


if __name__ == "__main__":
    main()
