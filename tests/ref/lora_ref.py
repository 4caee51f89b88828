#!/usr/bin/env python3
"""LoRA adapters for a tiny random-weight Llama, and the same adapters
merged into the weights offline, for lora_e2e.

    lora_ref.py SOURCE.gguf OUTDIR

Written to OUTDIR:
  base.gguf         the model (llama, adjacent-pair RoPE: its Q/K rows in
                    the GGUF converter's order), SOURCE's tokenizer
  base-hf/          the same as a Hugging Face directory (gguf_to_hf.py)
  lora-a/, lora-b/  PEFT adapters: a is rank 8 on all seven projections
                    (alpha 16); b is rank 4 on q_proj and v_proj with
                    use_rslora (alpha 8)
  lora-a.gguf, lora-b.gguf   the same adapters as GGUF LoRA files, as
                    llama.cpp's convert_lora_to_gguf writes them (Q/K rows
                    of B in the converter's order; alpha = scale * rank)
  merged-a/, merged-b/   base-hf with W + scale * B @ A written in: what a
                    user gets from PEFT's merge_and_unload
  bad-*/, bad-*.gguf   adapters the worker must refuse, named in bad.json
                    ({"dir": "setting the error names"})
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf import GGUFWriter  # noqa: E402
from tiny_gguf import vocab_size, write_gguf  # noqa: E402

SRC, OUT = sys.argv[1], sys.argv[2]
DIM, NH, NKV, HD, HID, NL = 64, 4, 2, 16, 128, 2
HERE = os.path.dirname(os.path.abspath(__file__))
MODS = {"q_proj": ("self_attn", NH * HD, DIM), "k_proj": ("self_attn", NKV * HD, DIM),
        "v_proj": ("self_attn", NKV * HD, DIM), "o_proj": ("self_attn", DIM, NH * HD),
        "gate_proj": ("mlp", HID, DIM), "up_proj": ("mlp", HID, DIM), "down_proj": ("mlp", DIM, HID)}


def base(vocab):
    r = np.random.default_rng(11)
    m = lambda n, k: (r.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    vec = lambda n: (1 + 0.1 * r.standard_normal(n)).astype(np.float32)
    w = {"token_embd.weight": (r.standard_normal((vocab, DIM)) * 0.5).astype(np.float32), "output_norm.weight": vec(DIM)}
    for l in range(NL):
        p = "blk.%d." % l
        w.update({p + "attn_norm.weight": vec(DIM), p + "ffn_norm.weight": vec(DIM),
                  p + "attn_q.weight": m(NH * HD, DIM) * 2, p + "attn_k.weight": m(NKV * HD, DIM) * 2,
                  p + "attn_v.weight": m(NKV * HD, DIM), p + "attn_output.weight": m(DIM, NH * HD),
                  p + "ffn_gate.weight": m(HID, DIM), p + "ffn_up.weight": m(HID, DIM), p + "ffn_down.weight": m(DIM, HID)})
    return w


def adapter(d, rank, alpha, targets, seed, rslora=False, extra_cfg=None, extra_tensors=None):
    r = np.random.default_rng(seed)
    os.makedirs(d, exist_ok=True)
    ts = {}
    for l in range(NL):
        for mod in targets:
            grp, n, k = MODS[mod]
            pre = "base_model.model.model.layers.%d.%s.%s." % (l, grp, mod)
            ts[pre + "lora_A.weight"] = (r.standard_normal((rank, k)) / np.sqrt(k)).astype(np.float32)
            ts[pre + "lora_B.weight"] = (r.standard_normal((n, rank)) * 0.3).astype(np.float32)
    ts.update(extra_tensors or {})
    save_file(ts, os.path.join(d, "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.05,
           "target_modules": list(targets), "bias": "none", "use_rslora": rslora, "use_dora": False,
           "fan_in_fan_out": False, "inference_mode": True, "base_model_name_or_path": "tiny-llama",
           "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}
    cfg.update(extra_cfg or {})
    json.dump(cfg, open(os.path.join(d, "adapter_config.json"), "w"), indent=1)
    return ts, alpha / (np.sqrt(rank) if rslora else rank)


GGUF_NAME = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def to_gguf_rows(b):
    """B's rows (Hugging Face order, heads of HD) in the GGUF converter's order: row i of a head in the file
    is row (i odd ? HD/2 + i/2 : i/2) of the checkpoint's head."""
    out = np.empty_like(b)
    for g in range(b.shape[0]):
        h, i = divmod(g, HD)
        out[g] = b[h * HD + (HD // 2 + i // 2 if i % 2 else i // 2)]
    return out


def gguf_lora(path, ts, scale, rank, extra_kv=(), extra_tensors=None):
    w = GGUFWriter(path, "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(scale * rank))
    for k, v in extra_kv:
        w.add_string(k, v)
    for l in range(NL):
        for mod, (grp, n, k) in MODS.items():
            pre = "base_model.model.model.layers.%d.%s.%s." % (l, grp, mod)
            if pre + "lora_A.weight" not in ts:
                continue
            b = ts[pre + "lora_B.weight"]
            if mod in ("q_proj", "k_proj"):
                b = to_gguf_rows(b)
            w.add_tensor("blk.%d.%s.weight.lora_a" % (l, GGUF_NAME[mod]), ts[pre + "lora_A.weight"])
            w.add_tensor("blk.%d.%s.weight.lora_b" % (l, GGUF_NAME[mod]), np.ascontiguousarray(b))
    for name, a in (extra_tensors or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def merge(base_hf, ts, scale, d):
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(base_hf, d)
    st = load_file(os.path.join(d, "model.safetensors"))
    for l in range(NL):
        for mod, (grp, n, k) in MODS.items():
            pre = "base_model.model.model.layers.%d.%s.%s." % (l, grp, mod)
            if pre + "lora_A.weight" in ts:
                name = "model.layers.%d.%s.%s.weight" % (l, grp, mod)
                st[name] = (st[name].astype(np.float64) + scale * ts[pre + "lora_B.weight"].astype(np.float64)
                            @ ts[pre + "lora_A.weight"].astype(np.float64)).astype(np.float32)
    save_file(st, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def main():
    os.makedirs(OUT, exist_ok=True)
    g = os.path.join(OUT, "base.gguf")
    hp = {"block_count": NL, "context_length": 1024, "embedding_length": DIM, "feed_forward_length": HID,
          "head_count": NH, "head_count_kv": NKV, "rope_freq_base": 10000.0, "layer_norm_rms_eps": 1e-5,
          "rope_dimension_count": HD}
    write_gguf(g, SRC, "llama", hp, base(vocab_size(SRC)))
    hf = os.path.join(OUT, "base-hf")
    shutil.rmtree(hf, ignore_errors=True)
    subprocess.run([sys.executable, os.path.join(HERE, "gguf_to_hf.py"), g, hf, "--dtype", "f32"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ta, sa = adapter(os.path.join(OUT, "lora-a"), 8, 16, list(MODS), 21)
    tb, sb = adapter(os.path.join(OUT, "lora-b"), 4, 8, ["q_proj", "v_proj"], 22, rslora=True)
    gguf_lora(os.path.join(OUT, "lora-a.gguf"), ta, sa, 8)
    gguf_lora(os.path.join(OUT, "lora-b.gguf"), tb, sb, 4)
    merge(hf, ta, sa, os.path.join(OUT, "merged-a"))
    merge(hf, tb, sb, os.path.join(OUT, "merged-b"))
    bad = {}
    for name, kw, want in (("dora", {"extra_cfg": {"use_dora": True}}, "use_dora"),
                           ("rank", {"rank": 32}, "--max-lora-rank"),
                           ("head", {"extra_tensors": {"base_model.model.lm_head.lora_A.weight":
                                                       np.zeros((8, DIM), np.float32)}}, "lm_head"),
                           ("target", {"targets": ["q_proj", "embed_tokens"]}, "embed_tokens"),
                           ("unknown", {"extra_cfg": {"use_magic": True}}, "use_magic")):
        d = os.path.join(OUT, "bad-" + name)
        args = {"rank": 8, "alpha": 16, "targets": ["q_proj"], "seed": 5}
        args.update(kw)
        if name == "target":  # the tensors of a module the config names but the engine does not adapt
            adapter(d, 8, 16, ["q_proj"], 5, extra_cfg={"target_modules": ["q_proj", "embed_tokens"]})
        else:
            adapter(d, **args)
        bad[d] = want
    for name, kw, want in (("alora", {"extra_kv": [("adapter.alora.invocation_string", "<x>")]},
                            "adapter.alora.invocation_string"),
                           ("embd", {"extra_tensors": {"token_embd.weight.lora_a": np.zeros((8, DIM), np.float32)}},
                            "token_embd.weight.lora_a")):
        f = os.path.join(OUT, "bad-%s.gguf" % name)
        gguf_lora(f, ta, sa, 8, **kw)
        bad[f] = want
    json.dump(bad, open(os.path.join(OUT, "bad.json"), "w"), indent=1)
    print("lora_ref: base, 2 adapters (PEFT and GGUF), 2 merged models, %d refusals in %s" % (len(bad), OUT))


if __name__ == "__main__":
    main()
