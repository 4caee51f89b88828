#!/usr/bin/env python3
"""Independent reference forward pass of a llama-family GGUF model in numpy.

Weights are dequantized by the `gguf` package (not by our C code); the maths
is written out plainly in float64/float32 from the architecture's definition.
Activations stay in float (our engine's reference mode, kn_set_act_f32);
the production int8-activation path is compared to it with a looser bound,
since int8 rounding makes a 30-layer network chaotic: a 1e-6 difference flips
roundings that cascade, so no independent implementation can match it bit
for bit.
Used to make tests/data/smollm2_golden.json:

    python3 tests/ref/llama_ref.py MODEL.gguf --out tests/data/smollm2_golden.json

Token ids come from `tests/ref/make_tokens.py`'s independent tokenizer, so the
golden file checks our tokenizer, kernels and forward pass together.
"""
import argparse
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = [
    "The capital of France is",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
]


def scaled_inv_freq(theta, d, sc):
    """Inverse frequencies [d/2] under a Hugging Face rope_scaling dict (None: plain), and the factor that
    multiplies cos and sin (yarn's attention factor), as transformers' _compute_*_parameters define them."""
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if not sc:
        return inv, 1.0
    t = sc.get("rope_type", sc.get("type"))
    f = float(sc.get("factor", 1.0))
    if t == "linear":
        return inv / f, 1.0
    if t == "dynamic":  # vLLM's: the NTK base for the longest context the factor allows
        base = theta * (f * f - (f - 1)) ** (d / (d - 2))
        return base ** (-np.arange(0, d, 2, dtype=np.float64) / d), 1.0
    if t == "llama3":
        old = sc["original_max_position_embeddings"]
        lo, hi = sc.get("low_freq_factor", 1.0), sc.get("high_freq_factor", 4.0)
        wavelen = 2 * np.pi / inv
        out = np.where(wavelen > old / lo, inv / f, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return np.where(mid, (1 - smooth) * out / f + smooth * out, out), 1.0
    if t == "yarn":
        orig = sc["original_max_position_embeddings"]
        bf, bs = sc.get("beta_fast", 32), sc.get("beta_slow", 1)
        dim_of = lambda rot: d * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(theta))
        lo, hi = dim_of(bf), dim_of(bs)
        if sc.get("truncate", True):  # gpt-oss's config says false: the blend's ends as they fall
            lo, hi = np.floor(lo), np.ceil(hi)
        lo, hi = max(lo, 0), min(hi, d - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extra = 1 - ramp
        inv = inv / f * (1 - extra) + inv * extra
        att = sc.get("attention_factor")
        return inv, att if att is not None else (0.1 * np.log(f) + 1.0 if f > 1 else 1.0)
    raise ValueError("rope type %s" % t)


class Model:
    def __init__(self, path, scaling=None, neox=None, norm_topk=True):
        """scaling: a Hugging Face rope_scaling dict that overrides the file's own; norm_topk: experts'
        weights renormalised over those chosen (Mixtral, Qwen3-MoE)."""
        r = GGUFReader(path)
        self.f = {k: v for k, v in r.fields.items()}
        arch = self.s("general.architecture")
        g = lambda k, d=None: self.v(f"{arch}.{k}", d)
        self.n_layer = int(g("block_count"))
        self.dim = int(g("embedding_length"))
        self.n_head = int(g("attention.head_count"))
        self.n_kv = int(g("attention.head_count_kv", self.n_head))
        self.hd = int(g("attention.key_length", self.dim // self.n_head))
        self.eps = float(g("attention.layer_norm_rms_epsilon", 1e-5))
        self.theta = float(g("rope.freq_base", 10000.0))
        self.neox = arch in ("qwen2", "qwen3", "qwen3moe", "gpt-oss") if neox is None else neox
        self.n_used = int(g("expert_used_count", 0))
        # gpt-oss: every other layer (the first, the third, ...) sees the last `window` positions only
        self.gpt_oss = arch == "gpt-oss"
        self.window = int(g("attention.sliding_window", 0)) if self.gpt_oss else 0
        self.norm_topk = norm_topk
        self.t = {}
        for t in r.tensors:
            w = dequantize(t.data, t.tensor_type).astype(np.float32)
            shape = [int(x) for x in t.shape]  # gguf order: ne0 first
            self.t[t.name] = w.reshape(list(reversed(shape)))
        st = g("rope.scaling.type")
        if scaling is None and st in ("linear", "yarn"):  # the GGUF spelling (llama.cpp's keys)
            f = float(g("rope.scaling.factor", 1.0))
            scaling = {"rope_type": st, "factor": f}
            if st == "yarn":
                scaling["original_max_position_embeddings"] = int(g("rope.scaling.original_context_length",
                                                                    g("context_length")))
                scaling["attention_factor"] = float(g("rope.scaling.attn_factor", 1.0)) * (0.1 * np.log(f) + 1.0)
                if self.gpt_oss:  # OpenAI's code (and Hugging Face's config, truncate: false)
                    scaling["truncate"] = False
        self.inv, self.mscale = scaled_inv_freq(self.theta, self.hd, scaling)
        if "rope_freqs.weight" in self.t:  # Llama 3.x GGUF: one divisor a frequency pair
            self.inv = self.inv / self.t["rope_freqs.weight"].astype(np.float64).reshape(-1)

    def v(self, k, d=None):
        f = self.f.get(k)
        return d if f is None else f.contents()

    def s(self, k):
        return self.f[k].contents()

    def rope(self, x, pos):  # x [n, hd]
        half = self.hd // 2
        ang = pos * self.inv
        c, s = np.cos(ang) * self.mscale, np.sin(ang) * self.mscale
        x = x.astype(np.float64)
        if self.neox:
            a, b = x[:, :half], x[:, half:]
            return np.concatenate([a * c - b * s, a * s + b * c], axis=1)
        a, b = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2] = a * c - b * s
        out[:, 1::2] = a * s + b * c
        return out

    def mm(self, x, name):
        """x [T, k] @ W[n, k].T in float64."""
        return x @ self.t[name].T

    def norm(self, x, w):
        x = x.astype(np.float64)
        return x / np.sqrt(np.mean(x * x) + self.eps) * w

    def expert(self, p, kind, e):
        """Expert e's [n, k] matrix: a slice of the merged ffn_{kind}_exps, or the older ffn_{kind}.E."""
        merged = p + "ffn_%s_exps.weight" % kind
        return self.t[merged][e] if merged in self.t else self.t[p + "ffn_%s.%d.weight" % (kind, e)]

    def moe(self, h, p):
        """Mixtral / Qwen3-MoE: softmax over every expert's router score, the top n_used, their weights
        renormalised (norm_topk), each a SwiGLU FFN; in float64."""
        out = np.zeros_like(h)
        logits = h @ self.t[p + "ffn_gate_inp.weight"].T
        for t in range(h.shape[0]):
            pr = np.exp(logits[t] - logits[t].max())
            pr /= pr.sum()
            top = np.argsort(-pr, kind="stable")[:self.n_used]
            w = pr[top] / (pr[top].sum() if self.norm_topk else 1.0)
            for e, we in zip(top, w):
                g_ = self.expert(p, "gate", e) @ h[t]
                u = self.expert(p, "up", e) @ h[t]
                out[t] += we * (self.expert(p, "down", e) @ (g_ / (1 + np.exp(-g_)) * u))
        return out

    def moe_oai(self, h, p, alpha=1.702, limit=7.0):
        """gpt-oss (Hugging Face's GptOssMLP): the router's logits with its bias, the top n_used softmaxed among
        themselves; each expert's gate and up with biases, the clamped SwiGLU, down with its bias."""
        out = np.zeros_like(h)
        logits = h @ self.t[p + "ffn_gate_inp.weight"].T + self.t[p + "ffn_gate_inp.bias"]
        for t in range(h.shape[0]):
            top = np.argsort(-logits[t], kind="stable")[:self.n_used]
            w = np.exp(logits[t][top] - logits[t][top].max())
            w /= w.sum()
            for e, we in zip(top, w):
                g_ = self.expert(p, "gate", e) @ h[t] + self.t[p + "ffn_gate_exps.bias"][e]
                u = self.expert(p, "up", e) @ h[t] + self.t[p + "ffn_up_exps.bias"][e]
                g_ = np.minimum(g_, limit)
                u = np.clip(u, -limit, limit)
                y = (u + 1) * (g_ / (1 + np.exp(-alpha * g_)))
                out[t] += we * (self.expert(p, "down", e) @ y + self.t[p + "ffn_down_exps.bias"][e])
        return out

    def forward(self, tokens, rows=None):
        """Logits for every position (or those in rows), [T, vocab], float64."""
        T = len(tokens)
        x = self.t["token_embd.weight"][tokens].astype(np.float64)
        group = self.n_head // self.n_kv
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = np.stack([self.norm(x[t], self.t[p + "attn_norm.weight"]) for t in range(T)])
            q = self.mm(h, p + "attn_q.weight")
            k = self.mm(h, p + "attn_k.weight")
            v = self.mm(h, p + "attn_v.weight")
            if p + "attn_q.bias" in self.t:
                q += self.t[p + "attn_q.bias"]
                k += self.t[p + "attn_k.bias"]
                v += self.t[p + "attn_v.bias"]
            q = q.reshape(T, self.n_head, self.hd)
            k = k.reshape(T, self.n_kv, self.hd)
            if p + "attn_q_norm.weight" in self.t:  # Qwen3: an RMS norm of each head before RoPE
                q = np.stack([[self.norm(q[t, hh], self.t[p + "attn_q_norm.weight"]) for hh in range(self.n_head)]
                              for t in range(T)])
                k = np.stack([[self.norm(k[t, hh], self.t[p + "attn_k_norm.weight"]) for hh in range(self.n_kv)]
                              for t in range(T)])
            q = np.stack([self.rope(q[t], t) for t in range(T)])
            k = np.stack([self.rope(k[t], t) for t in range(T)])
            v = v.reshape(T, self.n_kv, self.hd)
            att = np.zeros((T, self.n_head, self.hd))
            mask = np.triu(np.full((T, T), -np.inf), 1)
            if self.window and l % 2 == 0:  # position i sees i - window + 1 .. i
                mask = mask + np.tril(np.full((T, T), -np.inf), -self.window)
            sinks = self.t.get(p + "attn_sinks.weight")
            for hh in range(self.n_head):
                kv = hh // group
                s = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(self.hd) + mask
                if sinks is not None:  # a column of the head's sink logit, dropped after the softmax
                    s = np.concatenate([s, np.full((T, 1), float(sinks[hh]))], axis=1)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                att[:, hh, :] = s[:, :T] @ v[:, kv, :]
            x = x + self.mm(att.reshape(T, -1), p + "attn_output.weight")
            if p + "attn_output.bias" in self.t:
                x = x + self.t[p + "attn_output.bias"]
            nw = self.t[p + ("post_attention_norm.weight" if self.gpt_oss else "ffn_norm.weight")]
            h = np.stack([self.norm(x[t], nw) for t in range(T)])
            if self.gpt_oss:
                x = x + self.moe_oai(h, p)
                continue
            if p + "ffn_gate_inp.weight" in self.t:
                x = x + self.moe(h, p)
                continue
            g_ = self.mm(h, p + "ffn_gate.weight")
            u = self.mm(h, p + "ffn_up.weight")
            x = x + self.mm(g_ / (1 + np.exp(-g_)) * u, p + "ffn_down.weight")
        h = np.stack([self.norm(x[t], self.t["output_norm.weight"]) for t in (range(T) if rows is None else rows)])
        return self.mm(h, "output.weight" if "output.weight" in self.t else "token_embd.weight")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out")
    ap.add_argument("--tokens", default="tests/data/smollm2_tokens.json",
                    help="reference tokenizations (prompts are looked up there)")
    ap.add_argument("-n", type=int, default=32)
    a = ap.parse_args()
    m = Model(a.model)
    ref = {c["text"]: c["ids"] for c in json.load(open(a.tokens))["cases"]}
    cases = []
    for p in PROMPTS:
        ids = list(ref[p])
        gen, first_logits = [], None
        for _ in range(a.n):
            lg = m.forward(ids)[-1]
            if first_logits is None:
                first_logits = lg
            nxt = int(np.argmax(lg))
            gen.append(nxt)
            ids.append(nxt)
        cases.append({"prompt": p, "prompt_ids": ref[p], "greedy": gen,
                      "first_logits": [round(float(x), 5) for x in first_logits]})
        print(p[:40].replace("\n", " "), "->", gen[:12], file=sys.stderr)
    doc = {"magic": "llmserve-golden", "version": 1, "model_sha256":
           "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
           "made_by": "tests/ref/llama_ref.py (numpy, gguf dequantize)", "cases": cases}
    if a.out:
        json.dump(doc, open(a.out, "w"))
    else:
        json.dump(doc, sys.stdout)


if __name__ == "__main__":
    main()
