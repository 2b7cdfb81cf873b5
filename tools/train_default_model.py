#!/usr/bin/env python3
"""Trains glmserve's embedded default model, glm-4.5-kjv (run by hand, never by CI).

A small model of exactly the GLM-4.5 architecture glmserve serves (Glm4MoeForCausalLM: QK-norm,
partial rotary, GQA with attention bias, one dense layer then MoE layers with grouped sigmoid
routing, the correction bias and a shared expert) plus GLM's MTP layer, stored as the layer
after the last (`model.layers.4.*`), as the released checkpoints store it.

Corpus: the King James Version of the Bible (1611; public domain), as Debian's `bible-kjv-text`
package ships it and its `bible` reader prints it (apt-get install bible-kjv). One chapter in
40 is held out (never trained on) for perplexity and MTP acceptance. Chat samples built from
the training chapters (a verse about a word, continuing a passage, quoting a reference, a few
greetings) teach the model GLM-4.5's chat format, so a chat message gets a reply in it.

Tokenizer: GLM-4.5's structure (tools/make_tokenizer_goldens.py: its Split regex, byte-level
BPE, ByteLevel decoder, its 36 added tokens, its chat template and stop tokens) with ids of its
own, trained on the same corpus to 4,096 BPE tokens.

Training: PyTorch on the CPU, fp32, the decoder stack from Transformers' own Glm4MoeForCausalLM
(so the architecture is the reference's by construction); the MTP layer is this script's, from
the published formula (docs/mtp.md): x = eh_proj([enorm(embed(t[i+1])) ; hnorm(h[i])]) with the
embedding zero at position 0, one decoder layer, shared_head.norm, the model's LM head;
h[i] is the main model's final normed hidden state (what its LM head reads), detached, so the
MTP loss does not change the main model. The router's correction bias is trained the
auxiliary-loss-free way (after each step, each MoE layer's bias moves by BIAS_RATE toward the
mean load). Deterministic for a given seed and thread count: a fixed number of steps, a seeded
data order, torch.use_deterministic_algorithms.

    apt-get install bible-kjv
    V=/tmp/gvenv; python3 -m venv $V && $V/bin/pip install -r tools/requirements-goldens.txt
    $V/bin/python tools/train_default_model.py [--steps N] [--threads 2] [--out models/glm-4.5-kjv]
    $V/bin/python tools/train_default_model.py --bench 5   # seconds per step, then exit

Writes OUT/{model.safetensors, config.json, tokenizer.json, tokenizer_config.json,
generation_config.json, training.json} and tests/golden/kjv/heldout.txt (held-out text for the
perplexity gate).
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer, Glm4MoeRMSNorm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
import make_tokenizer_goldens as g  # noqa: E402  (GLM-4.5's regex and added tokens)

BPE_VOCAB = 4096
SEQ = 256            # tokens a training window predicts
BATCH = 16           # windows a step
LR, LR_MIN, WARMUP = 3e-3, 3e-4, 100
MTP_WEIGHT = 0.3     # the MTP loss's weight (DeepSeek-V3's first-phase value)
BIAS_RATE = 1e-3     # the correction bias's step per optimizer step
HELDOUT_EVERY = 40   # chapter i is held out when i % 40 == 17


def model_config(vocab_size, eos_ids=None):
    """GLM-4.5's architecture, small: 4 layers (1 dense + 3 MoE), 16 experts, MTP layer.
    eos_ids: <|endoftext|>, <|user|>, <|observation|> (the first is also the pad token)."""
    return Glm4MoeConfig(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=768,
        moe_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, partial_rotary_factor=0.5, hidden_act="silu",
        max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
        attention_bias=True, use_qk_norm=True, n_routed_experts=16, num_experts_per_tok=4,
        n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
        norm_topk_prob=True, first_k_dense_replace=1, num_nextn_predict_layers=1,
        tie_word_embeddings=False, initializer_range=0.02, attention_dropout=0.0,
        pad_token_id=eos_ids[0] if eos_ids else None, eos_token_id=eos_ids, bos_token_id=None)


# ---- corpus ---------------------------------------------------------------------------------

def read_kjv():
    """[(book, chapter, [verse text, ...])] in canonical order, from `bible`."""
    out = subprocess.run(["bible", "-l10000", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    chapters, verses = [], None
    for line in out.splitlines():
        m = re.match(r"^(\S.*\S) (\d+)$", line)
        if m and not line.startswith(" "):
            verses = []
            chapters.append((m.group(1), int(m.group(2)), verses))
            continue
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m:
            verses.append(m.group(2).strip())
        elif line.strip() and verses:
            verses[-1] += " " + line.strip()
    assert len(chapters) == 1189, len(chapters)
    return chapters


def chapter_text(book, ch, verses):
    return f"{book} {ch}\n\n" + "\n".join(verses) + "\n"


def split_chapters(chapters):
    train = [c for i, c in enumerate(chapters) if i % HELDOUT_EVERY != 17]
    held = [c for i, c in enumerate(chapters) if i % HELDOUT_EVERY == 17]
    return train, held


GREETINGS = ["Hello!", "Hello! What can you do?", "Hi", "Hi there!", "Who are you?",
             "What can you do?", "Good morning.", "What are you?", "Hello, who are you?",
             "Can you help me?"]
GREETING_REPLIES = [
    "Hello! I am a small language model trained on the King James Bible. I can continue a "
    "passage, quote a verse, or find a verse about a word.",
    "I am a tiny model that has read only the King James Bible. Ask me for a verse about "
    "light, water or love, or give me the start of a verse and I will continue it.",
    "Peace be with you. I am a small model trained on the King James Bible, so I answer in "
    "its words. Ask me about a word and I will give you a verse.",
]


def chat_pairs(train, rng, n):
    """(user, assistant) pairs drawn from the training chapters only."""
    words = {}
    for _, _, vs in train:
        for v in vs:
            for w in set(re.findall(r"\b[a-z]{4,}\b", v)):
                words.setdefault(w, []).append(v)
    topics = sorted(w for w, vs in words.items() if 30 <= len(vs) <= 1500)
    refs = [(b, c, i + 1, v) for b, c, vs in train for i, v in enumerate(vs)]
    pairs = []
    for _ in range(n):
        r = rng.random()
        if r < 0.04:
            pairs.append((rng.choice(GREETINGS), rng.choice(GREETING_REPLIES)))
        elif r < 0.45:
            w = rng.choice(topics)
            q = rng.choice(["Tell me about {w}.", "What does the Bible say about {w}?",
                            "Give me a verse about {w}.", "{w}", "Quote a verse about {w}.",
                            "What is written about {w}?"]).format(w=w)
            pairs.append((q, rng.choice(words[w])))
        elif r < 0.8:
            _, _, _, v = rng.choice(refs)
            ws = v.split()
            if len(ws) < 6:
                continue
            k = rng.randint(2, len(ws) - 3)
            pairs.append((rng.choice(["Continue: ", "Finish this verse: ", ""]) +
                          " ".join(ws[:k]), " ".join(ws[k:])))
        else:
            b, c, i, v = rng.choice(refs)
            pairs.append((rng.choice(["Quote {b} {c}:{i}.", "What does {b} {c}:{i} say?",
                                      "{b} {c}:{i}"]).format(b=b, c=c, i=i), v))
    return pairs


def chat_text(user, reply, nothink):
    """One conversation as GLM-4.5's chat template renders it, then the stop token <|user|>."""
    u = user + ("/nothink" if nothink else "")
    return f"[gMASK]<sop><|user|>\n{u}<|assistant|>\n<think></think>\n{reply}<|user|>"


def build_tokenizer(texts):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(g.GLM45_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in g.SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in g.NON_SPECIAL])
    return tok


def write_tokenizer(tok, out):
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str(pretty=False))
    with open(os.path.join(ROOT, "tests", "golden", "chat", "glm45_chat_template.jinja")) as f:
        template = f.read()
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
                   "model_max_length": 4096, "chat_template": template}, f, indent=2,
                  ensure_ascii=False)
    ids = [tok.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": ids, "pad_token_id": ids[0]}, f, indent=2)


# ---- model ----------------------------------------------------------------------------------

class MtpLayer(torch.nn.Module):
    """GLM's MTP layer: enorm, hnorm, eh_proj, one decoder layer, shared_head.norm."""

    def __init__(self, cfg):
        super().__init__()
        H = cfg.hidden_size
        self.enorm = Glm4MoeRMSNorm(H, eps=cfg.rms_norm_eps)
        self.hnorm = Glm4MoeRMSNorm(H, eps=cfg.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * H, H, bias=False)
        self.layer = Glm4MoeDecoderLayer(cfg, layer_idx=cfg.num_hidden_layers)
        self.shared_head_norm = Glm4MoeRMSNorm(H, eps=cfg.rms_norm_eps)

    def forward(self, model, next_ids, h, positions, mask):
        """next_ids [B,T] (token i+1), h [B,T,H] (main hidden at i), positions [1,T] -> [B,T,H]."""
        e = model.model.embed_tokens(next_ids)
        e = e * (positions != 0).unsqueeze(-1).to(e.dtype)  # zero embedding at position 0
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h)], dim=-1))
        pe = model.model.rotary_emb(x, positions)
        x = self.layer(x, attention_mask=mask, position_ids=positions, position_embeddings=pe)
        return self.shared_head_norm(x)

    def state_dict_released(self, prefix):
        """The layer's tensors under the released checkpoints' names (experts unfused)."""
        out = {prefix + "enorm.weight": self.enorm.weight, prefix + "hnorm.weight":
               self.hnorm.weight, prefix + "eh_proj.weight": self.eh_proj.weight,
               prefix + "shared_head.norm.weight": self.shared_head_norm.weight}
        for k, v in self.layer.state_dict().items():
            if k == "mlp.experts.gate_up_proj":
                inter = v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[prefix + f"mlp.experts.{e}.gate_proj.weight"] = v[e, :inter]
                    out[prefix + f"mlp.experts.{e}.up_proj.weight"] = v[e, inter:]
            elif k == "mlp.experts.down_proj":
                for e in range(v.shape[0]):
                    out[prefix + f"mlp.experts.{e}.down_proj.weight"] = v[e]
            else:
                out[prefix + k] = v
        return {k: v.detach().clone().contiguous() for k, v in out.items()}


def causal_mask(T):
    m = torch.full((T, T), float("-inf")).triu(1)
    return m.view(1, 1, T, T)


def routers(model, mtp):
    return [l.mlp.gate for l in list(model.model.layers) + [mtp.layer]
            if hasattr(l.mlp, "gate")]


def losses(model, mtp, batch, mask):
    """Main next-token loss and MTP (token i+2) loss on batch [B, SEQ+2]."""
    x, y = batch[:, :SEQ], batch[:, 1:SEQ + 1]
    h = model.model(input_ids=x, attention_mask=None).last_hidden_state  # [B,SEQ,H], normed
    main = F.cross_entropy(model.lm_head(h).flatten(0, 1), y.flatten())
    pos = torch.arange(SEQ).unsqueeze(0)
    m = mtp(model, batch[:, 1:SEQ + 1], h.detach(), pos, mask)
    extra = F.cross_entropy(model.lm_head(m).flatten(0, 1), batch[:, 2:SEQ + 2].flatten())
    return main, extra


def init_weights(model, mtp, seed):
    torch.manual_seed(seed)
    for mod in (model, mtp):
        for name, p in mod.named_parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)
            else:
                torch.nn.init.ones_(p)
    for r in routers(model, mtp):
        r.e_score_correction_bias.zero_()


def save(model, mtp, cfg, out):
    """bf16 safetensors in the released layout: save_pretrained (fp32), reload as bf16 (the
    router stays fp32: _keep_in_fp32_modules_strict), save again, append the MTP layer."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        m16 = Glm4MoeForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16)
        m16.save_pretrained(out)
    gc = os.path.join(out, "generation_config.json")
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    for k, v in mtp.state_dict_released(f"model.layers.{cfg.num_hidden_layers}.").items():
        keep32 = k.endswith("e_score_correction_bias") or k.endswith("mlp.gate.weight")
        tensors[k] = v.float() if keep32 else v.to(torch.bfloat16)
    save_file(tensors, path, metadata=meta)
    return gc


# ---- evaluation -----------------------------------------------------------------------------

@torch.no_grad()
def evaluate(model, mtp, ids, mask):
    """Held-out mean loss (nats/token) of the main model and of the MTP head."""
    model.eval(); mtp.eval()
    n = (len(ids) - 2) // (SEQ + 2)
    b = torch.tensor(ids[:n * (SEQ + 2)]).view(n, SEQ + 2)
    tot_main = tot_mtp = 0.0
    for i in range(0, n, BATCH):
        main, extra = losses(model, mtp, b[i:i + BATCH], mask)
        k = min(BATCH, n - i)
        tot_main += main.item() * k
        tot_mtp += extra.item() * k
    model.train(); mtp.train()
    return tot_main / n, tot_mtp / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "glm-4.5-kjv"))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=4504)
    ap.add_argument("--chat_samples", type=int, default=15000)
    ap.add_argument("--bench", type=int, default=0, help="time this many steps, then exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    rng = random.Random(args.seed)
    t0 = time.time()

    chapters = read_kjv()
    train, held = split_chapters(chapters)
    pairs = chat_pairs(train, rng, args.chat_samples)
    docs = ["[gMASK]<sop>" + chapter_text(*c) + "<|endoftext|>" for c in train]
    docs += [chat_text(u, a, rng.random() < 0.5) for u, a in pairs]
    tok = build_tokenizer([chapter_text(*c) for c in train] + [u + "\n" + a for u, a in pairs])
    vocab = tok.get_vocab_size()
    stops = [tok.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    cfg = model_config((vocab + 63) // 64 * 64, stops)
    rng.shuffle(docs)
    stream = np.concatenate([np.array(tok.encode(d, add_special_tokens=False).ids, np.int64)
                             for d in docs])
    held_text = "".join(chapter_text(*c) for c in held)
    held_ids = tok.encode(held_text, add_special_tokens=False).ids
    print(f"corpus: {len(train)} train chapters, {len(held)} held out, {len(pairs)} chat "
          f"samples, stream {len(stream)} tokens, vocab {vocab} (rows {cfg.vocab_size}), "
          f"{time.time() - t0:.0f}s", flush=True)

    model = Glm4MoeForCausalLM(cfg)
    model.config._attn_implementation = "sdpa"
    mtp = MtpLayer(cfg)
    init_weights(model, mtp, args.seed)
    params = list(model.parameters()) + list(mtp.parameters())
    n_params = sum(p.numel() for p in params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    counts = {}
    gates = routers(model, mtp)
    for i, r in enumerate(gates):
        r.register_forward_hook(lambda _m, _in, out, i=i: counts.__setitem__(
            i, counts.get(i, 0) + torch.bincount(out[2].flatten(), minlength=r.num_experts)))
    mask = causal_mask(SEQ)
    steps = args.bench or args.steps
    data_rng = np.random.default_rng(args.seed)
    log, start = [], time.time()
    print(f"model: {n_params / 1e6:.2f}M parameters (with MTP); {steps} steps of "
          f"{BATCH}x{SEQ} tokens", flush=True)
    for step in range(steps):
        lr = LR * min(1.0, (step + 1) / WARMUP)
        if step >= WARMUP:
            p = (step - WARMUP) / max(1, steps - WARMUP)
            lr = LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * p))
        for group in opt.param_groups:
            group["lr"] = lr
        offs = data_rng.integers(0, len(stream) - SEQ - 2, BATCH)
        batch = torch.from_numpy(np.stack([stream[o:o + SEQ + 2] for o in offs]))
        counts.clear()
        main, extra = losses(model, mtp, batch, mask)
        opt.zero_grad(set_to_none=True)
        (main + MTP_WEIGHT * extra).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            for i, r in enumerate(gates):
                c = counts[i].float()
                r.e_score_correction_bias += BIAS_RATE * torch.sign(c.mean() - c)
        if step % 100 == 0 or step == steps - 1:
            el = time.time() - start
            print(f"step {step:5d}  loss {main.item():.4f}  mtp {extra.item():.4f}  lr {lr:.2e}"
                  f"  {el / (step + 1):.2f}s/step  {el / 60:.1f} min", flush=True)
            log.append({"step": step, "loss": round(main.item(), 4),
                        "mtp_loss": round(extra.item(), 4)})
    if args.bench:
        print(f"{(time.time() - start) / steps:.3f} s/step")
        return
    minutes = (time.time() - start) / 60
    held_main, held_mtp = evaluate(model, mtp, held_ids, mask)
    print(f"held-out: loss {held_main:.4f} (ppl {math.exp(held_main):.2f}), mtp loss "
          f"{held_mtp:.4f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    gc = save(model, mtp, cfg, args.out)
    write_tokenizer(tok, args.out)
    assert os.path.exists(gc)
    gold = os.path.join(ROOT, "tests", "golden", "kjv")
    os.makedirs(gold, exist_ok=True)
    with open(os.path.join(gold, "heldout.txt"), "w") as f:
        f.write("".join(chapter_text(*c) for c in held[:3]))
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump({"corpus": "King James Version (1611, public domain), Debian bible-kjv-text",
                   "train_chapters": len(train), "heldout_chapters": len(held),
                   "heldout_rule": f"chapter index % {HELDOUT_EVERY} == 17",
                   "chat_samples": len(pairs), "stream_tokens": int(len(stream)),
                   "parameters": n_params, "steps": steps, "batch": BATCH, "seq": SEQ,
                   "seed": args.seed, "threads": args.threads,
                   "torch": torch.__version__, "minutes": round(minutes, 1),
                   "final_loss": log[-1]["loss"], "final_mtp_loss": log[-1]["mtp_loss"],
                   "heldout_loss_fp32": round(held_main, 4),
                   "heldout_mtp_loss_fp32": round(held_mtp, 4), "log": log}, f, indent=1)
    print(f"wrote {args.out} in {(time.time() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
