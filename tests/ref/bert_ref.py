#!/usr/bin/env python3
"""Independent reference of a BERT sentence-embedding model in numpy.

Token ids come from Hugging Face's `tokenizers` (Rust) reading the
checkpoint's tokenizer.json, with padding and truncation turned off; weights
from the `safetensors` package; the encoder is written out in float64 from
the architecture's definition (embeddings + LayerNorm, post-LN blocks, GELU
by erf, bidirectional softmax attention), then sentence-transformers' pooling
and normalisation as the checkpoint's modules.json says. Nothing here uses
our C code. Makes tests/data/minilm_golden.json:

    python3 tests/ref/bert_ref.py models/all-MiniLM-L6-v2 --out tests/data/minilm_golden.json

and checks `llmserve embed` output (JSON lines) against the model:

    llmserve embed --model DIR --file texts.txt | python3 tests/ref/bert_ref.py DIR --check - --texts texts.txt
"""
import argparse
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "HELLO, World!!! Mixed CaSe and punctuation: (a), [b], {c}; \"quotes\" & 'apostrophes'...",
    "Héllo naïve café, crème brûlée à la façon de Zoë; Ångström, Øresund, İstanbul.",
    "数据库 is a Chinese word; 東京 and 北京 are cities. 日本語のテキストも少し。",
    "한국어 문장도 토큰화합니다. Ελληνικά ΚΕΦΑΛΑΙΑ και πεζά. Русский текст.",
    "Emoji 🤖🚀 and symbols ©®™ ½ → ≠ ∑ √2 ≈ 1.414",
    "Numbers: 3.14159, 1,000,000, 2026-12-02, +44 (0)20 7946 0958, $19.99, 50%.",
    "A URL: https://example.org/path?q=embeddings&lang=en#section-2 and an email a.b@c.io",
    "tabs\tand\nnewlines\r\nand  multiple   spaces",
    "control\u0000chars\u0007here\u200band zero\u00adwidth",
    "[CLS] special tokens written in text [SEP] [MASK] [UNK]",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious",
    "x" * 120 + " long word then normal words",
    "",
    "a",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Sentence embeddings map text to vectors so that similar meanings land close together. " * 6,
    "How do I reset my password?",
    "I forgot my password, how can I change it?",
]


def load(model_dir):
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()
         if v.dtype.kind == "f"}
    pooling, normalize = "cls", True
    mods_path = os.path.join(model_dir, "modules.json")
    if os.path.exists(mods_path):
        normalize = False
        for m in json.load(open(mods_path)):
            if m["type"].endswith("Normalize"):
                normalize = True
            if m["type"].endswith("Pooling"):
                pc = json.load(open(os.path.join(model_dir, m["path"], "config.json")))
                pooling = "mean" if pc.get("pooling_mode_mean_tokens") else "cls"
    return tok, cfg, w, pooling, normalize


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def encode(ids, cfg, w, pooling, normalize):
    p = "" if "embeddings.word_embeddings.weight" in w else "bert."
    eps = cfg.get("layer_norm_eps", 1e-12)
    H = cfg["num_attention_heads"]
    D = cfg["hidden_size"]
    hd = D // H
    L = len(ids)
    x = (w[p + "embeddings.word_embeddings.weight"][ids] + w[p + "embeddings.position_embeddings.weight"][:L]
         + w[p + "embeddings.token_type_embeddings.weight"][0])
    x = layer_norm(x, w[p + "embeddings.LayerNorm.weight"], w[p + "embeddings.LayerNorm.bias"], eps)
    for l in range(cfg["num_hidden_layers"]):
        b = p + "encoder.layer.%d." % l
        lin = lambda v, n: v @ w[b + n + ".weight"].T + w[b + n + ".bias"]
        q = lin(x, "attention.self.query").reshape(L, H, hd).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(L, H, hd).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(L, H, hd).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(L, D)
        x = layer_norm(x + lin(a, "attention.output.dense"), w[b + "attention.output.LayerNorm.weight"],
                       w[b + "attention.output.LayerNorm.bias"], eps)
        h = gelu(lin(x, "intermediate.dense"))
        x = layer_norm(x + lin(h, "output.dense"), w[b + "output.LayerNorm.weight"], w[b + "output.LayerNorm.bias"], eps)
    e = x.mean(0) if pooling == "mean" else x[0]
    if normalize:
        e = e / max(np.linalg.norm(e), 1e-12)
    return e


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out")
    ap.add_argument("--check", help="llmserve embed output (JSON lines, '-' for stdin)")
    ap.add_argument("--texts", help="the texts --check's output came from, one per line")
    a = ap.parse_args()
    tok, cfg, w, pooling, normalize = load(a.model)
    if a.check:
        texts = open(a.texts, encoding="utf-8").read().split("\n")
        if texts and texts[-1] == "":
            texts.pop()
        rows = [json.loads(l) for l in (sys.stdin if a.check == "-" else open(a.check))]
        worst, bad = 1.0, 0
        for r in rows:
            ids = tok.encode(texts[r["index"]]).ids
            ref = encode(ids, cfg, w, pooling, normalize)
            got = np.array(r["embedding"])
            cos = float(got @ ref / np.linalg.norm(got) / np.linalg.norm(ref))
            worst = min(worst, cos)
            if ids != r["tokens"] or cos < 0.9999:
                bad += 1
                print("text %d: ids %s, cosine %.6f" % (r["index"], "equal" if ids == r["tokens"] else "DIFFER", cos))
        print("%d texts, worst cosine %.7f, %d bad" % (len(rows), worst, bad))
        sys.exit(1 if bad or not rows else 0)
    cases = []
    for t in TEXTS:
        ids = tok.encode(t).ids
        e = encode(ids, cfg, w, pooling, normalize)
        cases.append({"text": t, "ids": ids, "embedding": [float("%.7g" % v) for v in e]})
    out = {"magic": "llmserve-bert-golden", "version": 1, "model": os.path.basename(os.path.normpath(a.model)),
           "pooling": pooling, "normalize": normalize, "cases": cases}
    with open(a.out, "w") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")
    print("%d cases -> %s" % (len(cases), a.out), file=sys.stderr)


if __name__ == "__main__":
    main()
