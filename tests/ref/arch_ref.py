#!/usr/bin/env python3
"""Tiny random-weight models of every architecture beyond plain Llama, each
with reference logits from the independent numpy forward (llama_ref.py),
and models carrying settings the engine must refuse.

    arch_ref.py SOURCE.gguf OUTDIR

Made: Qwen3 (per-head query/key RMS norms, a head size other than
dim / heads), Qwen3-MoE (8 experts, 2 a token, merged ffn_*_exps tensors),
Mixtral (llama with experts: merged tensors, and the older per-expert
blk.N.ffn_gate.E.weight layout), gpt-oss (attention sinks, biases on q/k/v/o,
the router and the experts, MXFP4 experts, a sliding window on every other
layer, YaRN, the clamped SwiGLU), each also as a Hugging Face directory
(gguf_to_hf.py: Qwen3's / Qwen3-MoE's / Mixtral's own tensor names and
config.json keys). SOURCE lends its tokenizer. Written to OUTDIR as
rope_ref.py writes: NAME.gguf or NAME/, NAME.ref.json, manifest.json
[{"name", "path", "ref" | "refuse"}] for rope_test.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import Model  # noqa: E402
from tiny_gguf import vocab_size, write_gguf  # noqa: E402

SRC, OUT = sys.argv[1], sys.argv[2]
DIM, NH, NKV, NL, E, K = 64, 4, 2, 2, 8, 2
HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
HARMONY_TEMPLATE = ("{# gpt-oss (a stand-in: the engine reads the family from its markers) #}{% for m in messages %}"
                    "<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}<|end|>{% endfor %}")
GPT_OSS_KV = [("gpt-oss.expert_count", E, GGUFValueType.UINT32), ("gpt-oss.expert_used_count", 4, GGUFValueType.UINT32),
              ("gpt-oss.expert_feed_forward_length", 32, GGUFValueType.UINT32),
              ("gpt-oss.attention.sliding_window", 8, GGUFValueType.UINT32),
              ("gpt-oss.rope.scaling.type", "yarn", GGUFValueType.STRING),
              ("gpt-oss.rope.scaling.factor", 4.0, GGUFValueType.FLOAT32),
              ("gpt-oss.rope.scaling.original_context_length", 32, GGUFValueType.UINT32)]
IDS_N, CHECK_POS = 96, [10, 50, 95]
HERE = os.path.dirname(os.path.abspath(__file__))


def weights(vocab, hd, hid, qk_norm=False, experts=0, merged=True, seed=1):
    r = np.random.default_rng(seed)
    m = lambda n, k: (r.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    vec = lambda n: (1 + 0.1 * r.standard_normal(n)).astype(np.float32)
    w = {"token_embd.weight": (r.standard_normal((vocab, DIM)) * 0.5).astype(np.float32),
         "output_norm.weight": vec(DIM)}
    for l in range(NL):
        p = "blk.%d." % l
        w[p + "attn_norm.weight"] = vec(DIM)
        w[p + "ffn_norm.weight"] = vec(DIM)
        w[p + "attn_q.weight"] = m(NH * hd, DIM) * 2
        w[p + "attn_k.weight"] = m(NKV * hd, DIM) * 2
        w[p + "attn_v.weight"] = m(NKV * hd, DIM)
        w[p + "attn_output.weight"] = m(DIM, NH * hd)
        if qk_norm:
            w[p + "attn_q_norm.weight"] = vec(hd)
            w[p + "attn_k_norm.weight"] = vec(hd)
        if not experts:
            w[p + "ffn_gate.weight"] = m(hid, DIM)
            w[p + "ffn_up.weight"] = m(hid, DIM)
            w[p + "ffn_down.weight"] = m(DIM, hid)
            continue
        w[p + "ffn_gate_inp.weight"] = m(experts, DIM) * 4  # decided routing: no near ties
        g = np.stack([m(hid, DIM) for _ in range(experts)])
        u = np.stack([m(hid, DIM) for _ in range(experts)])
        d = np.stack([m(DIM, hid) for _ in range(experts)])
        if merged:
            w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"], w[p + "ffn_down_exps.weight"] = g, u, d
        else:
            for e in range(experts):
                w[p + "ffn_gate.%d.weight" % e], w[p + "ffn_up.%d.weight" % e] = g[e], u[e]
                w[p + "ffn_down.%d.weight" % e] = d[e]
    return w


def gpt_oss_weights(vocab, hd, hid, experts, seed=4):
    """gpt-oss: biases on q/k/v/o, sinks, post_attention_norm, a router with a bias, experts stored MXFP4
    (quantized by the gguf package) with biases."""
    r = np.random.default_rng(seed)
    m = lambda n, k: (r.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    vec = lambda n: (1 + 0.1 * r.standard_normal(n)).astype(np.float32)
    b = lambda *n: (0.1 * r.standard_normal(n)).astype(np.float32)
    mx = lambda a: (a, GGMLQuantizationType.MXFP4)
    w = {"token_embd.weight": (r.standard_normal((vocab, DIM)) * 0.5).astype(np.float32),
         "output_norm.weight": vec(DIM), "output.weight": m(vocab, DIM)}
    for l in range(NL):
        p = "blk.%d." % l
        w[p + "attn_norm.weight"] = vec(DIM)
        w[p + "post_attention_norm.weight"] = vec(DIM)
        w[p + "attn_q.weight"], w[p + "attn_q.bias"] = m(NH * hd, DIM) * 2, b(NH * hd)
        w[p + "attn_k.weight"], w[p + "attn_k.bias"] = m(NKV * hd, DIM) * 2, b(NKV * hd)
        w[p + "attn_v.weight"], w[p + "attn_v.bias"] = m(NKV * hd, DIM), b(NKV * hd)
        w[p + "attn_output.weight"], w[p + "attn_output.bias"] = m(DIM, NH * hd), b(DIM)
        w[p + "attn_sinks.weight"] = (2 * r.standard_normal(NH)).astype(np.float32)
        w[p + "ffn_gate_inp.weight"], w[p + "ffn_gate_inp.bias"] = m(experts, DIM) * 4, b(experts)
        # gate and up scaled up so the SwiGLU's clamps at +-7 are reached
        w[p + "ffn_gate_exps.weight"] = mx(np.stack([m(hid, DIM) * 6 for _ in range(experts)]))
        w[p + "ffn_up_exps.weight"] = mx(np.stack([m(hid, DIM) * 6 for _ in range(experts)]))
        w[p + "ffn_down_exps.weight"] = mx(np.stack([m(DIM, hid) for _ in range(experts)]))
        w[p + "ffn_gate_exps.bias"], w[p + "ffn_up_exps.bias"] = b(experts, hid), b(experts, hid)
        w[p + "ffn_down_exps.bias"] = b(experts, DIM)
    return w


def hparams(hd, hid):
    return {"block_count": NL, "context_length": 2048, "embedding_length": DIM, "feed_forward_length": hid,
            "head_count": NH, "head_count_kv": NKV, "rope_freq_base": 1000000.0, "layer_norm_rms_eps": 1e-6,
            "rope_dimension_count": hd, "key_length": hd}


def reference(path, name, ids):
    lg = Model(path).forward(ids, rows=CHECK_POS)
    json.dump({"ids": ids, "checks": [{"pos": p, "logits": [round(float(x), 6) for x in lg[i]]}
                                      for i, p in enumerate(CHECK_POS)]},
              open(os.path.join(OUT, name + ".ref.json"), "w"))
    return name + ".ref.json"


def hf(gguf, name, patch=None):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    subprocess.run([sys.executable, os.path.join(HERE, "gguf_to_hf.py"), gguf, d, "--dtype", "f32"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if patch:
        cp = os.path.join(d, "config.json")
        c = json.load(open(cp))
        c.update(patch)
        json.dump(c, open(cp, "w"), indent=1)
    return d


def main():
    os.makedirs(OUT, exist_ok=True)
    vocab = vocab_size(SRC)
    ids = [int(x) for x in np.random.default_rng(20261204).integers(300, vocab, IDS_N)]
    man = []
    models = [  # name, arch, head size, FFN (each expert's) width, kv, tensors
        ("qwen3", "qwen3", 32, 128, [], weights(vocab, 32, 128, qk_norm=True)),
        ("qwen3moe", "qwen3moe", 16, 32,
         [("qwen3moe.expert_count", E, GGUFValueType.UINT32), ("qwen3moe.expert_used_count", K, GGUFValueType.UINT32),
          ("qwen3moe.expert_feed_forward_length", 32, GGUFValueType.UINT32)],
         weights(vocab, 16, 32, qk_norm=True, experts=E, seed=2)),
        ("mixtral", "llama", 16, 64,
         [("llama.expert_count", E, GGUFValueType.UINT32), ("llama.expert_used_count", K, GGUFValueType.UINT32)],
         weights(vocab, 16, 64, experts=E, seed=3)),
        ("mixtral-per-expert", "llama", 16, 64,
         [("llama.expert_count", E, GGUFValueType.UINT32), ("llama.expert_used_count", K, GGUFValueType.UINT32)],
         weights(vocab, 16, 64, experts=E, merged=False, seed=3)),
        # gpt-oss: 8 experts of 32, 4 a token, MXFP4; a window of 8 on layer 0; YaRN x4 over 32 positions;
        # harmony's tokens at the vocabulary's end
        ("gpt-oss", "gpt-oss", 16, 32, GPT_OSS_KV, gpt_oss_weights(vocab + len(HARMONY), 16, 32, E)),
    ]
    paths = {}
    for name, arch, hd, hid, kv, ts in models:
        p = os.path.join(OUT, name + ".gguf")
        hp = hparams(hd, hid)
        if arch == "qwen3moe":
            hp["feed_forward_length"] = 4 * hid  # the dense width the file states and no layer uses
        if arch == "gpt-oss":  # a base whose YaRN blend ends fall between pairs (rounding them out would show)
            hp["rope_freq_base"] = 10000.0
        if arch == "gpt-oss":
            write_gguf(p, SRC, arch, hp, ts, kv, extra_control=HARMONY, chat_template=HARMONY_TEMPLATE)
        else:
            write_gguf(p, SRC, arch, hp, ts, kv)
        paths[name] = p
        man.append({"name": "gguf " + name, "path": p, "ref": reference(p, name, ids)})
    # the older per-expert layout is the same model as the merged one: the same reference
    assert man[3]["ref"] and json.load(open(os.path.join(OUT, man[3]["ref"])))["checks"][0]["logits"] == \
        json.load(open(os.path.join(OUT, man[2]["ref"])))["checks"][0]["logits"]
    for name in ("qwen3", "qwen3moe", "mixtral", "gpt-oss"):
        man.append({"name": "hf " + name, "path": hf(paths[name], "hf-" + name), "ref": name + ".ref.json"})
    # Qwen3-MoE without renormalising the chosen experts' weights (norm_topk_prob false), by its reference
    d = hf(paths["qwen3moe"], "hf-qwen3moe-nonorm", {"norm_topk_prob": False})
    lg = Model(paths["qwen3moe"], norm_topk=False).forward(ids, rows=CHECK_POS)
    json.dump({"ids": ids, "checks": [{"pos": p, "logits": [round(float(x), 6) for x in lg[i]]}
                                      for i, p in enumerate(CHECK_POS)]},
              open(os.path.join(OUT, "qwen3moe-nonorm.ref.json"), "w"))
    man.append({"name": "hf qwen3moe norm_topk_prob false", "path": d, "ref": "qwen3moe-nonorm.ref.json"})
    # what must be refused, by name
    for i, (patch, key) in enumerate((({"mlp_only_layers": [0]}, "mlp_only_layers"),
                                      ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
                                      ({"shared_expert_intermediate_size": 64}, "shared_expert_intermediate_size"))):
        man.append({"name": "hf qwen3_moe %s" % json.dumps(patch), "path": hf(paths["qwen3moe"], "hf-refuse-%d" % i,
                                                                             patch), "refuse": key})
    d = hf(paths["mixtral"], "hf-refuse-mixtral", {"norm_topk_prob": False})
    man.append({"name": "hf mixtral norm_topk_prob false", "path": d, "refuse": "norm_topk_prob"})
    for i, (patch, key) in enumerate((({"layer_types": ["full_attention"] * NL}, "layer_types"),
                                      ({"quantization_config": None}, "mxfp4"),
                                      ({"experts_per_token": 2}, "experts_per_token"))):
        man.append({"name": "hf gpt_oss %s" % json.dumps(patch)[:40], "path": hf(paths["gpt-oss"], "hf-refuse-oss-%d" % i,
                                                                                  patch), "refuse": key})
    for i, (arch, kv, key) in enumerate((
            ("qwen3moe", [("qwen3moe.expert_shared_feed_forward_length", 64, GGUFValueType.UINT32)],
             "qwen3moe.expert_shared_feed_forward_length"),
            ("qwen3moe", [("qwen3moe.expert_weights_scale", 2.5, GGUFValueType.FLOAT32)], "expert_weights_scale"),
            ("qwen3", [("qwen3.expert_count", E, GGUFValueType.UINT32)], "qwen3.expert_count"),
            ("gpt-oss", [("gpt-oss.attention.sliding_window_pattern", 3, GGUFValueType.UINT32)],
             "gpt-oss.attention.sliding_window_pattern"))):
        p = os.path.join(OUT, "refuse-%d.gguf" % i)
        src = models[1] if arch == "qwen3moe" else models[4] if arch == "gpt-oss" else models[0]
        write_gguf(p, SRC, arch, hparams(src[2], src[3]), src[5], src[4] + kv,
                   extra_control=HARMONY if arch == "gpt-oss" else ())
        man.append({"name": "gguf %s" % kv[0][0], "path": p, "refuse": key})
    json.dump(man, open(os.path.join(OUT, "manifest.json"), "w"), indent=1)
    print("arch_ref: %d models in %s" % (len(man), OUT))


if __name__ == "__main__":
    main()
