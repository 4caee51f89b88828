#!/usr/bin/env python3
"""Tiny random-weight Llama models with every RoPE scaling the ecosystem
writes, each with reference logits from the independent numpy forward
(llama_ref.py), and models carrying settings the engine must refuse.

    rope_ref.py SOURCE.gguf OUTDIR

SOURCE lends its tokenizer (the default model's: our loader needs a real
one). Written to OUTDIR: NAME.gguf or NAME/ (a Hugging Face directory made
by gguf_to_hf.py, its config.json given the setting), NAME.ref.json (token
ids and the reference logits at positions past the original context), and
manifest.json: [{"name", "path", "ref" | "refuse"}], where "refuse" is the
key or tensor name the loader's error must name.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from gguf import GGUFValueType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_gguf  # noqa: E402
from llama_ref import Model, scaled_inv_freq  # noqa: E402
from tiny_gguf import vocab_size  # noqa: E402

SRC, OUT = sys.argv[1], sys.argv[2]
DIM, NH, NKV, HD, HID, NL = 64, 4, 2, 16, 128, 2
ORIG, THETA = 128, 10000.0  # the "trained" context: every reference position past it
IDS_N, CHECK_POS = 320, [40, 200, 319]
rng = np.random.default_rng(20261203)


def write_gguf(path, ctx, kv=(), tensors=None, extra=()):
    vocab = vocab_size(SRC)
    hp = {"block_count": NL, "context_length": ctx, "embedding_length": DIM, "feed_forward_length": HID,
          "head_count": NH, "head_count_kv": NKV, "rope_freq_base": THETA, "layer_norm_rms_eps": 1e-5,
          "rope_dimension_count": HD}
    ts = dict(tensors if tensors is not None else weights(vocab))
    ts.update(extra)
    tiny_gguf.write_gguf(path, SRC, "llama", hp, ts, kv)
    return vocab


_W = {}


def weights(vocab):
    if not _W:
        r = np.random.default_rng(7)
        m = lambda n, k: (r.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        _W["token_embd.weight"] = (r.standard_normal((vocab, DIM)) * 0.5).astype(np.float32)
        _W["output_norm.weight"] = (1 + 0.1 * r.standard_normal(DIM)).astype(np.float32)
        for l in range(NL):
            p = "blk.%d." % l
            _W[p + "attn_norm.weight"] = (1 + 0.1 * r.standard_normal(DIM)).astype(np.float32)
            _W[p + "ffn_norm.weight"] = (1 + 0.1 * r.standard_normal(DIM)).astype(np.float32)
            _W[p + "attn_q.weight"] = m(NH * HD, DIM) * 2  # sharp attention: positions matter
            _W[p + "attn_k.weight"] = m(NKV * HD, DIM) * 2
            _W[p + "attn_v.weight"] = m(NKV * HD, DIM)
            _W[p + "attn_output.weight"] = m(DIM, NH * HD)
            _W[p + "ffn_gate.weight"] = m(HID, DIM)
            _W[p + "ffn_up.weight"] = m(HID, DIM)
            _W[p + "ffn_down.weight"] = m(DIM, HID)
    return _W


def reference(path, name, ids, scaling=None, neox=None):
    m = Model(path, scaling=scaling, neox=neox)
    lg = m.forward(ids, rows=CHECK_POS)
    json.dump({"ids": ids, "checks": [{"pos": p, "logits": [round(float(x), 6) for x in lg[i]]}
                                      for i, p in enumerate(CHECK_POS)]},
              open(os.path.join(OUT, name + ".ref.json"), "w"))
    return name + ".ref.json"


def hf_dir(gguf, name, patch):
    """A copy (hard links) of the converted plain model, its config.json patched."""
    base = os.path.join(OUT, "hf-base")
    if not os.path.isdir(base):
        subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf_to_hf.py"), gguf,
                        base, "--dtype", "f32"], check=True, stdout=subprocess.DEVNULL)
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for f in os.listdir(base):
        if f != "config.json":
            os.link(os.path.join(base, f), os.path.join(d, f))
    cp = os.path.join(d, "config.json")
    shutil.copy(os.path.join(base, "config.json"), cp)
    c = json.load(open(cp))
    c.update(patch)
    json.dump(c, open(cp, "w"), indent=1)
    return d


def main():
    os.makedirs(OUT, exist_ok=True)
    man = []
    plain = os.path.join(OUT, "plain.gguf")
    vocab = write_gguf(plain, 4096)
    ids = [int(x) for x in rng.integers(300, vocab, IDS_N)]
    man.append({"name": "gguf none", "path": plain, "ref": reference(plain, "plain", ids)})
    # Llama 3.x: rope_freqs.weight, one divisor a pair (what llama.cpp's converter writes), context 4096
    l3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": ORIG}
    base = THETA ** (-np.arange(0, HD, 2, dtype=np.float64) / HD)
    freqs = (base / scaled_inv_freq(THETA, HD, l3)[0]).astype(np.float32)
    p = os.path.join(OUT, "llama3.gguf")
    write_gguf(p, 4096, extra=[("rope_freqs.weight", freqs)])
    man.append({"name": "gguf llama3 (rope_freqs.weight)", "path": p, "ref": reference(p, "llama3", ids)})
    for t, kv in (("linear", [("llama.rope.scaling.factor", 4.0, GGUFValueType.FLOAT32)]),
                  ("yarn", [("llama.rope.scaling.factor", 4.0, GGUFValueType.FLOAT32),
                            ("llama.rope.scaling.original_context_length", ORIG, GGUFValueType.UINT32)])):
        p = os.path.join(OUT, t + ".gguf")
        write_gguf(p, ORIG, kv=[("llama.rope.scaling.type", t, GGUFValueType.STRING)] + kv)
        man.append({"name": "gguf " + t, "path": p, "ref": reference(p, t, ids)})
    # --rope-scaling on a model without scaling: the same maths as yarn.gguf's own keys
    p = os.path.join(OUT, "short.gguf")
    write_gguf(p, ORIG)
    y = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG}
    man.append({"name": "gguf + --rope-scaling yarn", "path": p, "rope_scaling": json.dumps(y), "ref": "yarn.ref.json"})
    man.append({"name": "gguf linear + --rope-scaling", "path": os.path.join(OUT, "linear.gguf"),
                "rope_scaling": json.dumps(y), "refuse": "--rope-scaling"})
    # Hugging Face directories: the plain weights, config.json's rope_scaling (q/k rotate in halves there)
    for t, sc, mpe in (("llama3", l3, 4096),
                       ("linear", {"rope_type": "linear", "factor": 4.0}, ORIG),
                       ("dynamic", {"type": "dynamic", "factor": 4.0}, ORIG),
                       ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG}, ORIG),
                       ("yarn-attn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG,
                                      "attention_factor": 1.3, "beta_fast": 16, "beta_slow": 2}, ORIG)):
        d = hf_dir(plain, "hf-" + t, {"rope_scaling": sc, "max_position_embeddings": mpe})
        man.append({"name": "hf " + t, "path": d, "ref": reference(plain, "hf-" + t, ids, scaling=sc)})
    # what must be refused, by name
    refuse = [("llama.attention.sliding_window", 64, GGUFValueType.UINT32),
              ("llama.attn_logit_softcapping", 50.0, GGUFValueType.FLOAT32),
              ("llama.final_logit_softcapping", 30.0, GGUFValueType.FLOAT32),
              ("llama.expert_shared_count", 2, GGUFValueType.UINT32),
              ("llama.rope.scaling.yarn_log_multiplier", 0.1, GGUFValueType.FLOAT32),
              ("llama.rope.scaling.type", "longrope", GGUFValueType.STRING)]
    for i, (k, v, t) in enumerate(refuse):
        p = os.path.join(OUT, "refuse-%d.gguf" % i)
        write_gguf(p, ORIG, kv=[(k, v, t)])
        man.append({"name": "gguf %s = %s" % (k, v), "path": p, "refuse": k if "longrope" != v else "longrope"})
    p = os.path.join(OUT, "refuse-tensor.gguf")
    write_gguf(p, ORIG, extra=[("blk.0.attn_q_norm.weight", np.ones(HD, np.float32))])
    man.append({"name": "gguf with blk.0.attn_q_norm.weight", "path": p, "refuse": "blk.0.attn_q_norm.weight"})
    for i, (k, v) in enumerate((("sliding_window", 64), ("attn_logit_softcapping", 50.0),
                                ("final_logit_softcapping", 30.0), ("mlp_bias", True), ("hidden_act", "gelu"),
                                ("qk_norm", True), ("num_experts", 8),
                                ("rope_scaling", {"rope_type": "longrope", "factor": 4.0}),
                                ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "mscale_alll": 1}),
                                ("rope_scaling", {"rope_type": "linear", "factor": 4.0, "low_freq_factor": 1}))):
        d = hf_dir(plain, "hf-refuse-%d" % i, {k: v})
        want = {"rope_scaling": None}.get(k, k)
        if isinstance(v, dict):
            want = "longrope" if v["rope_type"] == "longrope" else next(x for x in v if x not in ("rope_type", "factor"))
        man.append({"name": "hf %s = %s" % (k, json.dumps(v)), "path": d, "refuse": want})
    json.dump(man, open(os.path.join(OUT, "manifest.json"), "w"), indent=1)
    print("rope_ref: %d models in %s" % (len(man), OUT))


if __name__ == "__main__":
    main()
