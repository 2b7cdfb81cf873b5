"""The golden scripts' independent check: GLM-4.5's forward in float64 numpy, written from
docs/model.md's math and read straight from a checkpoint's files (config.json and the
safetensors shards `files`), sharing no code with Transformers. make_goldens.py requires it to
agree with Transformers before it writes a fixture."""
import json
import os

import numpy as np
from safetensors import safe_open


def np_forward(d, prompt, files):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    rp = c.get("rope_parameters") or {}
    theta = rp.get("rope_theta", c.get("rope_theta", 10000.0))  # HF default
    prf = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.5))
    W = {}
    for fn in files:
        with safe_open(os.path.join(d, fn), "pt") as f:
            for k in f.keys():
                W[k] = f.get_tensor(k).double().numpy()
    L = c["num_hidden_layers"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]

    def rms(x, w):
        return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))

    def silu(x):
        return x / (1 + np.exp(-x))

    def mlp(x, p, gate_w=None, up_w=None, down_w=None):
        g = x @ (W[p + "gate_proj.weight"] if gate_w is None else gate_w).T
        u = x @ (W[p + "up_proj.weight"] if up_w is None else up_w).T
        return (silu(g) * u) @ (W[p + "down_proj.weight"] if down_w is None else down_w).T

    T = len(prompt)
    h = W["model.embed_tokens.weight"][prompt]
    r = int(hd * prf)
    inv = theta ** (-np.arange(0, r, 2) / r)
    ang = np.arange(T)[:, None] * inv[None]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # x [T, heads, hd]
        x = x.copy()
        a, b = x[..., : r // 2].copy(), x[..., r // 2: r].copy()
        cc, ss = cos[:, None], sin[:, None]
        x[..., : r // 2] = a * cc - b * ss
        x[..., r // 2: r] = b * cc + a * ss
        return x

    hs = [h]
    for l in range(L):
        p = f"model.layers.{l}."
        x = rms(h, W[p + "input_layernorm.weight"])
        a = p + "self_attn."
        q = x @ W[a + "q_proj.weight"].T + W.get(a + "q_proj.bias", 0)
        k = x @ W[a + "k_proj.weight"].T + W.get(a + "k_proj.bias", 0)
        v = x @ W[a + "v_proj.weight"].T + W.get(a + "v_proj.bias", 0)
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if c.get("use_qk_norm"):
            q, k = rms(q, W[a + "q_norm.weight"]), rms(k, W[a + "k_norm.weight"])
        q, k = rope(q), rope(k)
        out = np.zeros((T, nh, hd))
        for hh in range(nh):
            kv = hh // (nh // nkv)
            sc = q[:, hh] @ k[:, kv].T / np.sqrt(hd)
            sc = np.where(np.tril(np.ones((T, T))) > 0, sc, -np.inf)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            out[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v[:, kv]
        h = h + out.reshape(T, nh * hd) @ W[a + "o_proj.weight"].T
        x = rms(h, W[p + "post_attention_layernorm.weight"])
        m = p + "mlp."
        if l < c["first_k_dense_replace"]:
            y = mlp(x, m)
        else:
            E, G, TG, K = c["n_routed_experts"], c["n_group"], c["topk_group"], c["num_experts_per_tok"]
            s = 1 / (1 + np.exp(-(x @ W[m + "gate.weight"].T)))
            cs = s + W[m + "gate.e_score_correction_bias"]
            y = mlp(x, m + "shared_experts.")
            fused = m + "experts.gate_up_proj" in W
            I = c["moe_intermediate_size"]
            for t in range(T):
                gs = np.sort(cs[t].reshape(G, E // G), -1)[:, -2:].sum(-1)
                keep = np.zeros(G, bool)
                keep[np.argsort(-gs, kind="stable")[:TG]] = True
                masked = np.where(np.repeat(keep, E // G), cs[t], -np.inf)
                sel = np.argsort(-masked, kind="stable")[:K]
                w = s[t, sel]
                if c["norm_topk_prob"]:
                    w = w / (w.sum() + 1e-20)
                w = w * c["routed_scaling_factor"]
                for wi, e in zip(w, sel):
                    if fused:
                        gu = W[m + "experts.gate_up_proj"][e]
                        y[t] += wi * mlp(x[t], None, gu[:I], gu[I:], W[m + "experts.down_proj"][e])
                    else:
                        y[t] += wi * mlp(x[t], m + f"experts.{e}.")
        h = h + y
        hs.append(h)
    # Transformers 5.x: a stored lm_head.weight is used even when tie_word_embeddings is
    # set (4.x tied them); without one the head is the embedding.
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    logits = rms(h, W["model.norm.weight"]) @ head.T
    return logits, np.stack(hs)
