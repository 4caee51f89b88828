#!/usr/bin/env python3
"""Independent reference forward pass of a Gemma 3 GGUF model in numpy, and
reference tokenizations by SentencePiece (Google's C++ library, built here
from the GGUF's own vocabulary, scores and token types).

Weights are dequantized by the `gguf` package (not by our C code); the maths
is written out plainly in float64 from the architecture's definition
(Hugging Face's Gemma3ForCausalLM; the GGUF's norm weights already hold the
"1 +" of Gemma's RMSNorm, as llama.cpp's converter adds it):

    x = embed[ids] * sqrt(dim)
    per layer: h = x + post_attention_norm(attn(attn_norm(x)))
               x = h + post_ffw_norm(down(gelu_tanh(gate(n)) * up(n))), n = ffn_norm(h)
    attn: q, k RMS-normed per head (attn_q_norm, attn_k_norm), rotate-halves RoPE, scores / sqrt(head_dim);
          local layers (all but every 6th) see the last `sliding_window` positions with RoPE base 10,000,
          global ones everything with the file's base
    logits = output_norm(x) . embed^T

The golden file keeps, per prompt, the 256 largest first-step logits (the
vocabulary is 262,144: the whole row would be megabytes) and the greedy
continuation. One prompt is longer than the window, so local layers drop
their oldest positions.

    python3 tests/ref/gemma_ref.py MODEL.gguf --out tests/data/gemma3_golden.json
"""
import argparse
import hashlib
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = [
    "The capital of France is",
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "def fibonacci(n):\n    ",
    # about 640 tokens: past the 512-position window of the local layers
    "Here is a list of numbers, one per line, counting up:\n" + "".join(f"{i}\n" for i in range(1, 160)),
]


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        self.f = {k: v for k, v in r.fields.items()}
        arch = self.f["general.architecture"].contents()
        assert arch == "gemma3", arch
        g = lambda k, d=None: self.v(f"{arch}.{k}", d)
        self.n_layer = int(g("block_count"))
        self.dim = int(g("embedding_length"))
        self.n_head = int(g("attention.head_count"))
        self.n_kv = int(g("attention.head_count_kv", self.n_head))
        self.hd = int(g("attention.key_length", self.dim // self.n_head))
        self.eps = float(g("attention.layer_norm_rms_epsilon", 1e-6))
        self.theta = float(g("rope.freq_base", 1e6))
        self.window = int(g("attention.sliding_window"))
        self.t = {}
        for t in r.tensors:
            w = dequantize(t.data, t.tensor_type).astype(np.float32)
            self.t[t.name] = w.reshape(list(reversed([int(x) for x in t.shape])))

    def v(self, k, d=None):
        f = self.f.get(k)
        return d if f is None else f.contents()

    def rope(self, x, pos, theta):  # x [n, hd], rotate halves
        half = self.hd // 2
        inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / self.hd)
        c, s = np.cos(pos * inv), np.sin(pos * inv)
        a, b = x[:, :half], x[:, half:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=1)

    def norm(self, x, w):  # rows of x
        x = x.astype(np.float64)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def mm(self, x, name):
        return x @ self.t[name].T.astype(np.float64)

    def forward(self, tokens):
        """Logits of the last position, float64."""
        T = len(tokens)
        x = self.t["token_embd.weight"][tokens].astype(np.float64) * np.sqrt(self.dim)
        group = self.n_head // self.n_kv
        pos = np.arange(T)
        for l in range(self.n_layer):
            p = f"blk.{l}."
            local = (l + 1) % 6 != 0
            theta = 10000.0 if local else self.theta
            h = self.norm(x, self.t[p + "attn_norm.weight"])
            q = self.norm(self.mm(h, p + "attn_q.weight").reshape(T, self.n_head, self.hd), self.t[p + "attn_q_norm.weight"])
            k = self.norm(self.mm(h, p + "attn_k.weight").reshape(T, self.n_kv, self.hd), self.t[p + "attn_k_norm.weight"])
            v = self.mm(h, p + "attn_v.weight").reshape(T, self.n_kv, self.hd)
            q = np.stack([self.rope(q[t], t, theta) for t in range(T)])
            k = np.stack([self.rope(k[t], t, theta) for t in range(T)])
            d = pos[:, None] - pos[None, :]  # query - key
            allowed = (d >= 0) & ((d < self.window) if local else True)
            mask = np.where(allowed, 0.0, -np.inf)
            att = np.zeros((T, self.n_head, self.hd))
            for hh in range(self.n_head):
                kv = hh // group
                s = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(self.hd) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                att[:, hh, :] = s @ v[:, kv, :]
            o = self.mm(att.reshape(T, -1), p + "attn_output.weight")
            x = x + self.norm(o, self.t[p + "post_attention_norm.weight"])
            h = self.norm(x, self.t[p + "ffn_norm.weight"])
            g_ = self.mm(h, p + "ffn_gate.weight")
            gelu = 0.5 * g_ * (1 + np.tanh(np.sqrt(2 / np.pi) * (g_ + 0.044715 * g_ ** 3)))
            f = self.mm(gelu * self.mm(h, p + "ffn_up.weight"), p + "ffn_down.weight")
            x = x + self.norm(f, self.t[p + "post_ffw_norm.weight"])
        h = self.norm(x[-1:], self.t["output_norm.weight"])
        return self.mm(h, "token_embd.weight")[0]


def sp_tokenizer(path):
    """SentencePiece (BPE by piece scores, byte fallback, no dummy prefix, no normalization) over the
    GGUF's vocabulary: an implementation independent of ours."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    r = GGUFReader(path)
    f = {k: v for k, v in r.fields.items()}
    toks, scores, types = (f["tokenizer.ggml." + k].contents() for k in ("tokens", "scores", "token_type"))
    mp = pb.ModelProto()
    mp.trainer_spec.model_type = pb.TrainerSpec.BPE
    mp.trainer_spec.byte_fallback = True
    mp.trainer_spec.unk_id, mp.trainer_spec.bos_id, mp.trainer_spec.eos_id, mp.trainer_spec.pad_id = 3, 2, 1, 0
    mp.normalizer_spec.name = "identity"
    mp.normalizer_spec.add_dummy_prefix = bool(f["tokenizer.ggml.add_space_prefix"].contents())
    mp.normalizer_spec.remove_extra_whitespaces = False
    mp.normalizer_spec.escape_whitespaces = True
    kind = {1: pb.ModelProto.SentencePiece.NORMAL, 2: pb.ModelProto.SentencePiece.UNKNOWN,
            3: pb.ModelProto.SentencePiece.CONTROL, 4: pb.ModelProto.SentencePiece.USER_DEFINED,
            5: pb.ModelProto.SentencePiece.UNUSED, 6: pb.ModelProto.SentencePiece.BYTE}
    for t, s, ty in zip(toks, scores, types):
        p = mp.pieces.add()
        p.piece, p.score, p.type = t, float(s), kind[int(ty)]
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(mp.SerializeToString())
    # Tokens matched in the raw text before SentencePiece sees it, longest first, as Hugging Face's
    # tokenizer.json does with its added tokens (Gemma's user-defined "\n", runs of spaces and tabs, its
    # HTML tags) and as our chat prompts need for the two turn markers
    whole = {t: i for i, (t, ty) in enumerate(zip(toks, types)) if int(ty) == 4}
    whole.update({s: toks.index(s) for s in ("<start_of_turn>", "<end_of_turn>")})
    longest = max(len(t) for t in whole)

    def encode(text):
        ids, i, start = [2], 0, 0  # <bos>
        while i < len(text):
            hit = next((text[i:i + n] for n in range(min(longest, len(text) - i), 0, -1) if text[i:i + n] in whole), None)
            if hit:
                ids += sp.encode(text[start:i]) if i > start else []
                ids.append(whole[hit])
                i += len(hit)
                start = i
            else:
                i += 1
        return ids + (sp.encode(text[start:]) if start < len(text) else [])
    return encode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out")
    ap.add_argument("-n", type=int, default=16)
    a = ap.parse_args()
    encode = sp_tokenizer(a.model)
    m = Model(a.model)
    cases = []
    for p in PROMPTS:
        ids = encode(p)
        prompt_ids = list(ids)
        gen, top = [], None
        for _ in range(a.n):
            lg = m.forward(ids)
            if top is None:
                order = np.argsort(-lg)[:256]
                top = [[int(i), round(float(lg[i]), 5)] for i in order]
            nxt = int(np.argmax(lg))
            gen.append(nxt)
            ids.append(nxt)
        cases.append({"prompt": p, "prompt_ids": prompt_ids, "greedy": gen, "top_logits": top})
        print(len(prompt_ids), p[:40].replace("\n", " "), "->", gen[:12], file=sys.stderr)
    sha = hashlib.sha256(open(a.model, "rb").read()).hexdigest()
    doc = {"magic": "llmserve-golden", "version": 1, "model_sha256": sha,
           "made_by": "tests/ref/gemma_ref.py (numpy, gguf dequantize, sentencepiece)", "cases": cases}
    out = open(a.out, "w") if a.out else sys.stdout
    json.dump(doc, out)


if __name__ == "__main__":
    main()
