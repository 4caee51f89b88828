#!/usr/bin/env python3
"""A Mixtral-shaped GGUF scaled to a small machine, random Q4_0 weights, for
moe_bench.sh: both engines read the same file.

    moe_gguf.py SOURCE.gguf OUT.gguf [--layers N] [--dim D] [--expert-ffn H] [--experts E] [--used K] [--gpt-oss]

--experts 0: a dense model instead (ffn_gate/up/down of FFN size H, no router), for llama.cpp and us
to read the same file at a real size; Llama-3-8B's shape (SOURCE's vocabulary: 4.15 GB with SmolLM2's):
    --experts 0 --layers 32 --dim 4096 --heads 32 --kv-heads 8 --expert-ffn 14336

llama architecture with experts (as llama.cpp's converter writes Mixtral):
merged blk.N.ffn_{gate,up,down}_exps tensors, an F32 router, Q4_0 matrices
(random codes, scale 1/sqrt(row length) as the dummy loader's), F32 norms.
--gpt-oss: gpt-oss instead (as llama.cpp's converter writes it): MXFP4
experts (random codes, scales near 1/sqrt(row length)) with F32 biases, a
router bias, attention biases and sinks, every other layer a 128-position
window, YaRN. SOURCE lends its tokenizer (and so the vocabulary size)."""
import argparse

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter


def q4_0(rng, rows, k):
    """[rows, k/32 * 18] bytes of Q4_0 blocks: an f16 scale and 16 bytes of random nibbles."""
    nb = k // 32
    b = rng.integers(0, 256, size=(rows, nb, 18), dtype=np.uint8)
    b[:, :, 0:2] = np.frombuffer(np.float16(1.0 / np.sqrt(k) / 8).tobytes(), np.uint8)
    return b.reshape(rows, nb * 18)


def mxfp4(rng, rows, k):
    """[rows, k/32 * 17] bytes of MXFP4 blocks: an E8M0 scale (the largest code, 12, near 3/sqrt(k)) and 16
    bytes of random nibbles."""
    nb = k // 32
    b = rng.integers(0, 256, size=(rows, nb, 17), dtype=np.uint8)
    b[:, :, 0] = int(round(128 + np.log2(3 / np.sqrt(k) / 12)))
    return b.reshape(rows, nb * 17)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--expert-ffn", type=int, default=3584)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--used", type=int, default=2)
    ap.add_argument("--gpt-oss", action="store_true")
    a = ap.parse_args()
    r = GGUFReader(a.src)
    vocab = len(r.fields["tokenizer.ggml.tokens"].contents())
    D, H, E, hd = a.dim, a.expert_ffn, a.experts, a.dim // a.heads
    oss = a.gpt_oss
    w = GGUFWriter(a.out, "gpt-oss" if oss else "llama")
    w.add_name("gpt-oss-shaped" if oss else "mixtral-shaped" if a.experts else "dense-%dL-%d" % (a.layers, a.dim))
    if oss:
        w.add_key_value("gpt-oss.expert_feed_forward_length", H, GGUFValueType.UINT32)
        w.add_key_value("gpt-oss.attention.sliding_window", 128, GGUFValueType.UINT32)
        w.add_key_value("gpt-oss.rope.scaling.type", "yarn", GGUFValueType.STRING)
        w.add_key_value("gpt-oss.rope.scaling.factor", 32.0, GGUFValueType.FLOAT32)
        w.add_key_value("gpt-oss.rope.scaling.original_context_length", 4096, GGUFValueType.UINT32)
    w.add_block_count(a.layers)
    w.add_context_length(131072 if oss else 4096)
    w.add_embedding_length(D)
    w.add_feed_forward_length(H)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    if E:
        w.add_expert_count(E)
        w.add_expert_used_count(a.used)
    w.add_file_type(2)  # mostly Q4_0
    for name, f in r.fields.items():
        if name.startswith("tokenizer."):
            t = f.types[0]
            if t == GGUFValueType.ARRAY:
                w.add_key_value(name, f.contents(), t, sub_type=f.types[-1])
            else:
                w.add_key_value(name, f.contents(), t)
    rng = np.random.default_rng(1)
    q = GGMLQuantizationType.Q4_0
    ones = lambda n: np.ones(n, np.float32)
    w.add_tensor("token_embd.weight", q4_0(rng, vocab, D), raw_dtype=q)
    w.add_tensor("output_norm.weight", ones(D))
    w.add_tensor("output.weight", q4_0(rng, vocab, D), raw_dtype=q)
    for l in range(a.layers):
        p = "blk.%d." % l
        w.add_tensor(p + "attn_norm.weight", ones(D))
        w.add_tensor(p + ("post_attention_norm.weight" if oss else "ffn_norm.weight"), ones(D))
        if oss:
            b = lambda *n: (0.02 * rng.standard_normal(n)).astype(np.float32)
            w.add_tensor(p + "attn_q.bias", b(D))
            w.add_tensor(p + "attn_k.bias", b(a.kv_heads * hd))
            w.add_tensor(p + "attn_v.bias", b(a.kv_heads * hd))
            w.add_tensor(p + "attn_output.bias", b(D))
            w.add_tensor(p + "attn_sinks.weight", ones(a.heads))
            w.add_tensor(p + "ffn_gate_inp.bias", b(E))
            w.add_tensor(p + "ffn_gate_exps.bias", b(E, H))
            w.add_tensor(p + "ffn_up_exps.bias", b(E, H))
            w.add_tensor(p + "ffn_down_exps.bias", b(E, D))
            mx = GGMLQuantizationType.MXFP4
            w.add_tensor(p + "ffn_gate_exps.weight", mxfp4(rng, E * H, D).reshape(E, H, -1), raw_dtype=mx)
            w.add_tensor(p + "ffn_up_exps.weight", mxfp4(rng, E * H, D).reshape(E, H, -1), raw_dtype=mx)
            w.add_tensor(p + "ffn_down_exps.weight", mxfp4(rng, E * D, H).reshape(E, D, -1), raw_dtype=mx)
        w.add_tensor(p + "attn_q.weight", q4_0(rng, D, D), raw_dtype=q)
        w.add_tensor(p + "attn_k.weight", q4_0(rng, a.kv_heads * hd, D), raw_dtype=q)
        w.add_tensor(p + "attn_v.weight", q4_0(rng, a.kv_heads * hd, D), raw_dtype=q)
        w.add_tensor(p + "attn_output.weight", q4_0(rng, D, D), raw_dtype=q)
        if not E:  # dense
            w.add_tensor(p + "ffn_gate.weight", q4_0(rng, H, D), raw_dtype=q)
            w.add_tensor(p + "ffn_up.weight", q4_0(rng, H, D), raw_dtype=q)
            w.add_tensor(p + "ffn_down.weight", q4_0(rng, D, H), raw_dtype=q)
            continue
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((E, D)) / np.sqrt(D)).astype(np.float32))
        if not oss:
            w.add_tensor(p + "ffn_gate_exps.weight", q4_0(rng, E * H, D).reshape(E, H, -1), raw_dtype=q)
            w.add_tensor(p + "ffn_up_exps.weight", q4_0(rng, E * H, D).reshape(E, H, -1), raw_dtype=q)
            w.add_tensor(p + "ffn_down_exps.weight", q4_0(rng, E * D, H).reshape(E, D, -1), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
