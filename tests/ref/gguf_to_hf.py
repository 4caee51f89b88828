#!/usr/bin/env python3
"""Writes a llama-family GGUF as a Hugging Face checkpoint directory, for
the test of our Hugging Face loader (tests/e2e/run_hf_e2e.sh):

    config.json            the GGUF's hyper-parameters under Hugging Face's names
    model.safetensors      every weight dequantized by the `gguf` package (not
                           our C code) and stored as F16 (or --dtype bf16 / f32),
                           with Q and K rows put back in Hugging Face's order
                           (the GGUF converter interleaves them for its RoPE)
    tokenizer.json         the GGUF's byte-level BPE vocabulary and merges, its
                           control tokens as added tokens, the pre-tokenizer its
                           metadata names
    tokenizer_config.json  BOS / EOS, add_bos_token and the chat template

Written with the `safetensors` package; `tokenizers` then reads the
tokenizer.json back (--check-tokens) so the file is known to be one the
reference library takes.

    python3 tests/ref/gguf_to_hf.py MODEL.gguf OUT_DIR [--dtype f16|bf16|f32] [--check-tokens]
"""
import argparse
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    if f.types and f.types[0].name == "STRING":
        return bytes(v).decode("utf-8")
    return v.tolist()[0] if hasattr(v, "tolist") else v


def strings(r, key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def ints(r, key):
    f = r.fields.get(key)
    return [int(f.parts[i][0]) for i in f.data] if f else None


def unpermute(w, n_head):
    """GGUF's llama Q/K rows are (head, pair, half) interleaved; Hugging Face's are (head, half, pair)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


PRE = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    "gpt2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
}


def hf_mxfp4(raw, rows, k):
    """GGUF MXFP4 rows [rows, k/32 blocks of (e, qs[16]: element j low nibble, j+16 high)] as OpenAI's
    checkpoint holds them: blocks [rows, k/32, 16] (element 2i low nibble of byte i, 2i+1 high) and the E8M0
    scales [rows, k/32] apart; the codes and scales themselves unchanged."""
    b = np.frombuffer(raw.tobytes(), dtype=np.uint8).reshape(rows, k // 32, 17)
    e, qs = b[:, :, 0], b[:, :, 1:]
    u = np.concatenate([qs & 15, qs >> 4], axis=2)  # element order 0..31
    return np.ascontiguousarray(u[:, :, 0::2] | (u[:, :, 1::2] << 4)).astype(np.uint8), np.ascontiguousarray(e)


def gpt_oss_tensors(r):
    """gpt-oss under OpenAI's / Hugging Face's names: experts kept MXFP4 with gate and up interleaved row by
    row (and their biases), the rest dequantized."""
    out, parts = [], {}
    layer = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
             "post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.router"}
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    for t in r.tensors:
        n = t.name
        if not n.startswith("blk."):
            w = dequantize(t.data, t.tensor_type).astype(np.float32)
            out.append((top[n], w.reshape([int(x) for x in reversed(t.shape)])))
            continue
        _, l, kind, suffix = n.split(".", 3)
        if kind.endswith("_exps"):
            parts[(l, kind[4:-5], suffix)] = t
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else w.reshape(-1)
        hf = "model.layers.%s.self_attn.sinks" % l if kind == "attn_sinks" else \
            "model.layers.%s.%s.%s" % (l, layer[kind], suffix)
        out.append((hf, w))
    for l in sorted({k[0] for k in parts}):
        g, u, d = (parts[(l, x, "weight")] for x in ("gate", "up", "down"))
        E, F, D = int(g.shape[2]), int(g.shape[1]), int(g.shape[0])
        gb, gs = hf_mxfp4(g.data, E * F, D)
        ub, us = hf_mxfp4(u.data, E * F, D)
        blocks = np.empty((E, 2 * F, D // 32, 16), np.uint8)
        scales = np.empty((E, 2 * F, D // 32), np.uint8)
        blocks[:, 0::2], blocks[:, 1::2] = gb.reshape(E, F, D // 32, 16), ub.reshape(E, F, D // 32, 16)
        scales[:, 0::2], scales[:, 1::2] = gs.reshape(E, F, D // 32), us.reshape(E, F, D // 32)
        bias = np.empty((E, 2 * F), np.float32)
        bias[:, 0::2] = np.asarray(parts[(l, "gate", "bias")].data).reshape(E, F)
        bias[:, 1::2] = np.asarray(parts[(l, "up", "bias")].data).reshape(E, F)
        db, ds = hf_mxfp4(d.data, E * D, F)
        p = "model.layers.%s.mlp.experts." % l
        out += [(p + "gate_up_proj_blocks", blocks), (p + "gate_up_proj_scales", scales), (p + "gate_up_proj_bias", bias),
                (p + "down_proj_blocks", db.reshape(E, D, F // 32, 16)), (p + "down_proj_scales", ds.reshape(E, D, F // 32)),
                (p + "down_proj_bias", np.asarray(parts[(l, "down", "bias")].data).reshape(E, D).astype(np.float32))]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16", "f32"])
    ap.add_argument("--check-tokens", action="store_true")
    a = ap.parse_args()
    r = GGUFReader(a.gguf)
    arch = field(r, "general.architecture")
    if arch not in ("llama", "qwen3", "qwen3moe", "gpt-oss"):
        sys.exit("gguf_to_hf: architecture %s is not handled here" % arch)
    n_exp = int(field(r, arch + ".expert_count", 0))
    mixtral = arch == "llama" and n_exp > 0
    n_head = int(field(r, arch + ".attention.head_count"))
    n_kv = int(field(r, arch + ".attention.head_count_kv", n_head))
    dim = int(field(r, arch + ".embedding_length"))
    os.makedirs(a.out, exist_ok=True)
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    layer = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
             "ffn_gate_inp": "block_sparse_moe.gate" if mixtral else "mlp.gate"}
    # an expert's matrices: Mixtral's w1 / w3 / w2, Qwen3-MoE's gate_proj / up_proj / down_proj
    expert = ({"ffn_gate": "block_sparse_moe.experts.%d.w1", "ffn_up": "block_sparse_moe.experts.%d.w3",
               "ffn_down": "block_sparse_moe.experts.%d.w2"} if mixtral else
              {"ffn_gate": "mlp.experts.%d.gate_proj", "ffn_up": "mlp.experts.%d.up_proj",
               "ffn_down": "mlp.experts.%d.down_proj"})
    tensors = {}
    pending = []
    if arch == "gpt-oss":
        pending = gpt_oss_tensors(r)
    for t in ([] if arch == "gpt-oss" else r.tensors):
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else w.reshape(-1)
        n = t.name
        if n.startswith("blk."):
            _, l, kind, suffix = n.split(".", 3)
            if arch == "llama" and kind == "attn_q":  # llama's GGUF q/k rotate pairs: back to halves
                w = unpermute(w, n_head)
            elif arch == "llama" and kind == "attn_k":
                w = unpermute(w, n_kv)
            if kind.endswith("_exps"):  # merged [E, n, k]: one tensor an expert
                for e in range(w.shape[0]):
                    pending.append(("model.layers.%s.%s.weight" % (l, expert[kind[:-5]] % e), w[e]))
                continue
            if n_exp and kind in expert and suffix != "weight":  # the older blk.N.ffn_gate.E.weight
                e, suffix = suffix.split(".", 1)
                hf = "model.layers.%s.%s.%s" % (l, expert[kind] % int(e), suffix)
            else:
                hf = "model.layers.%s.%s.%s" % (l, layer[kind], suffix)
        else:
            hf = names[n]
        pending.append((hf, w))
    for hf, w in pending:
        if w.dtype == np.uint8:  # MXFP4 blocks and scales stay as they are
            tensors[hf] = w
            continue
        if a.dtype == "f16":
            w = w.astype(np.float16)
        elif a.dtype == "bf16":  # round to nearest even, stored as the uint16 safetensors' BF16 reads
            u = w.view(np.uint32)
            w = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        tensors[hf] = np.ascontiguousarray(w)
    if a.dtype == "bf16":  # safetensors.numpy has no bfloat16: write the file's header by hand
        hdr, off, blobs = {}, 0, []
        for k, v in tensors.items():
            b = v.tobytes()
            hdr[k] = {"dtype": "U8" if v.dtype == np.uint8 else "BF16", "shape": list(v.shape),
                      "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        h = json.dumps(hdr).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    else:
        save_file(tensors, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    toks = strings(r, "tokenizer.ggml.tokens")
    types = ints(r, "tokenizer.ggml.token_type") or [1] * len(toks)
    merges = strings(r, "tokenizer.ggml.merges")
    mt = {"llama": "mixtral" if mixtral else "llama", "qwen3": "qwen3", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss"}[arch]
    config = {
        "architectures": [{"llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3": "Qwen3ForCausalLM",
                           "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM"}[mt]],
        "model_type": mt, "hidden_size": dim,
        "intermediate_size": int(field(r, arch + ".feed_forward_length")),
        "num_hidden_layers": int(field(r, arch + ".block_count")), "num_attention_heads": n_head,
        "num_key_value_heads": n_kv, "vocab_size": len(toks),
        "max_position_embeddings": int(field(r, arch + ".context_length", 2048)),
        "rms_norm_eps": float(field(r, arch + ".attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(field(r, arch + ".rope.freq_base", 10000.0)),
        "tie_word_embeddings": "lm_head.weight" not in tensors, "hidden_act": "silu",
        "torch_dtype": {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}[a.dtype],
    }
    if arch != "llama":
        config["head_dim"] = int(field(r, arch + ".attention.key_length", dim // n_head))
    if mixtral:
        config.update(num_local_experts=n_exp, num_experts_per_tok=int(field(r, arch + ".expert_used_count")),
                      router_aux_loss_coef=0.02, output_router_logits=False)
    elif arch == "qwen3moe":
        config.update(num_experts=n_exp, num_experts_per_tok=int(field(r, arch + ".expert_used_count")),
                      moe_intermediate_size=int(field(r, arch + ".expert_feed_forward_length")),
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    elif arch == "gpt-oss":  # as OpenAI's config.json spells it
        nl, orig = config["num_hidden_layers"], int(field(r, arch + ".rope.scaling.original_context_length"))
        config.update(num_local_experts=n_exp, num_experts_per_tok=int(field(r, arch + ".expert_used_count")),
                      experts_per_token=int(field(r, arch + ".expert_used_count")), attention_bias=True,
                      intermediate_size=int(field(r, arch + ".expert_feed_forward_length")),
                      sliding_window=int(field(r, arch + ".attention.sliding_window")), swiglu_limit=7.0,
                      layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(nl)],
                      initial_context_length=orig, max_position_embeddings=orig * int(field(r, arch + ".rope.scaling.factor")),
                      rope_scaling={"rope_type": "yarn", "factor": float(field(r, arch + ".rope.scaling.factor")),
                                    "original_max_position_embeddings": orig, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False},
                      quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
                          "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
                      router_aux_loss_coef=0.9, output_router_logits=False)
    json.dump(config, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    control = [(i, s) for i, (s, ty) in enumerate(zip(toks, types)) if ty == 3]
    pre = field(r, "tokenizer.ggml.pre", "gpt2")
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in control],
        "normalizer": None, "pre_tokenizer": PRE["smollm" if pre in ("smollm", "starcoder") else "gpt2"],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {s: i for i, s in enumerate(toks)}, "merges": merges},
    }
    json.dump(tok, open(os.path.join(a.out, "tokenizer.json"), "w"), ensure_ascii=False)
    bos, eos = field(r, "tokenizer.ggml.bos_token_id"), field(r, "tokenizer.ggml.eos_token_id")
    tc = {"bos_token": toks[int(bos)] if bos is not None else None, "eos_token": toks[int(eos)] if eos is not None else None,
          "add_bos_token": bool(field(r, "tokenizer.ggml.add_bos_token", False)),
          "chat_template": field(r, "tokenizer.chat_template")}
    json.dump(tc, open(os.path.join(a.out, "tokenizer_config.json"), "w"), indent=2, ensure_ascii=False)
    if a.check_tokens:
        from tokenizers import Tokenizer
        t = Tokenizer.from_file(os.path.join(a.out, "tokenizer.json"))
        ids = t.encode("Hello world, 12345!", add_special_tokens=False).ids
        print("tokenizers reads it: %d tokens for a test sentence" % len(ids), file=sys.stderr)
    print("%s: %d tensors (%s), vocabulary %d, %d merges" % (a.out, len(tensors), a.dtype, len(toks), len(merges)),
          file=sys.stderr)


if __name__ == "__main__":
    main()
