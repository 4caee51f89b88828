#!/usr/bin/env python3
"""AWQ and GPTQ checkpoints for the test of our loader, written from the
formats' specifications (AutoAWQ's "gemm" packing, AutoGPTQ's packing and
its v1 / v2 zero points), with numpy only; no quantization library.

    pack SRC OUT --method gptq|awq [--bits 4|8] [--group N] [--asym] [--act-order] [--v2]
        SRC is a float Hugging Face directory (tests/ref/gguf_to_hf.py --dtype f32).
        Every q/k/v/o/gate/up/down projection is quantized here, round to
        nearest per group (GPTQ's min-max grid: symmetric, zero (maxq+1)/2, or
        asymmetric; AWQ asymmetric), and packed:
          GPTQ  qweight int32 [K/pack, N]  input k of column n in bits (k%pack)*bits
                                           of qweight[k//pack, n]
                qzeros  int32 [G, N/pack]  z-1 (v1, AutoGPTQ) or z (gptq_v2), packed along N
                scales  fp16  [G, N];  g_idx int32 [K] (the group of each input)
          AWQ   qweight int32 [K, N/8]     column 8c+ORDER[i] in bits 4i of word c,
                qzeros  int32 [G, N/8]     ORDER = 0 2 4 6 1 3 5 7
                scales  fp16  [G, N]
        With --act-order (GPTQ) the inputs are grouped in the order of
        decreasing column norm (summed over q/k/v, or gate/up: the weights
        reading one input share it, as GPTQ's Hessian order is the input's),
        as desc_act groups them by decreasing Hessian diagonal, so g_idx is a
        permutation of groups, not k // group.
        The other tensors are stored as F16. After packing, the unpacker below
        reads the file back and must give exactly the values quantized.

    unpack QDIR OUT
        The numpy unpacker: dequantizes every packed layer of QDIR,
        w[n, k] = scales[g, n] * (q[k, n] - z[g, n]) (g = g_idx[k], or k // group),
        and writes a plain F32 directory: the reference our loader's
        conversion is compared with (tests/unit/hfq_test.c) and the model
        `llmserve eval` runs against.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def quantize(w, bits, group, sym, key):
    """w [N, K] float32 -> q [N, K] ints, scales [G, N] fp16, zeros [G, N] ints, g_idx [K].
    key [K] or None: act-order, the inputs grouped in decreasing key."""
    n, k = w.shape
    gs = group if group > 0 else k
    maxq = (1 << bits) - 1
    if key is not None:
        perm = np.argsort(-key, kind="stable")
        g_idx = np.empty(k, np.int32)
        g_idx[perm] = np.arange(k) // gs
    else:
        g_idx = (np.arange(k) // gs).astype(np.int32)
    G = k // gs
    scales = np.zeros((G, n), np.float16)
    zeros = np.zeros((G, n), np.int64)
    q = np.zeros((n, k), np.int64)
    for g in range(G):
        cols = np.nonzero(g_idx == g)[0]
        x = w[:, cols].astype(np.float32)
        if sym:
            amax = np.abs(x).max(axis=1)
            s = 2 * amax / maxq
            z = np.full(n, (maxq + 1) // 2)
        else:
            lo, hi = np.minimum(x.min(axis=1), 0), np.maximum(x.max(axis=1), 0)
            s = (hi - lo) / maxq
            z = None
        s = np.where(s == 0, 1, s).astype(np.float16)
        sf = s.astype(np.float32)
        if z is None:
            z = np.clip(np.round(-lo / sf), 0, maxq).astype(np.int64)
        q[:, cols] = np.clip(np.round(x / sf[:, None]) + z[:, None], 0, maxq)
        scales[g] = s
        zeros[g] = z
    return q, scales, zeros, g_idx


def pack_fields(v, bits, axis):
    """Packs 32/bits values to an int32 along axis, the first in the lowest bits."""
    pack = 32 // bits
    v = np.moveaxis(v.astype(np.uint32) & ((1 << bits) - 1), axis, 0)
    out = np.zeros((v.shape[0] // pack,) + v.shape[1:], np.uint32)
    for i in range(pack):
        out |= v[i::pack] << np.uint32(i * bits)
    return np.moveaxis(out, 0, axis).view(np.int32)


def unpack_fields(p, bits, axis):
    pack = 32 // bits
    p = np.moveaxis(p.view(np.uint32), axis, 0)
    out = np.zeros((p.shape[0] * pack,) + p.shape[1:], np.int64)
    for i in range(pack):
        out[i::pack] = (p >> np.uint32(i * bits)) & ((1 << bits) - 1)
    return np.moveaxis(out, 0, axis)


def awq_pack(v):
    """v [R, N] 4-bit -> [R, N/8]: column 8c+AWQ_ORDER[i] in bits 4i."""
    r, n = v.shape
    out = np.zeros((r, n // 8), np.uint32)
    v = v.astype(np.uint32).reshape(r, n // 8, 8)
    for i, col in enumerate(AWQ_ORDER):
        out |= (v[:, :, col] & 15) << np.uint32(4 * i)
    return out.view(np.int32)


def awq_unpack(p):
    r, c = p.shape
    p = p.view(np.uint32)
    out = np.zeros((r, c, 8), np.int64)
    for i, col in enumerate(AWQ_ORDER):
        out[:, :, col] = (p >> np.uint32(4 * i)) & 15
    return out.reshape(r, c * 8)


def save(tensors, out):
    """safetensors.numpy writes an array's memory as it lies: C order first."""
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})


def pack(a):
    src = load_file(os.path.join(a.src, "model.safetensors"))
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    os.makedirs(a.out, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(a.src, f)):
            shutil.copy(os.path.join(a.src, f), a.out)
    sym = not a.asym and a.method == "gptq"
    out, expect = {}, {}
    # act-order: GPTQ orders a layer's inputs by its Hessian's diagonal, one for every weight that reads
    # that input (q/k/v; gate/up); here by the sum of those weights' squared columns
    readers = {"self_attn.q_proj": ("q_proj", "k_proj", "v_proj"), "self_attn.k_proj": ("q_proj", "k_proj", "v_proj"),
               "self_attn.v_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_proj": ("gate_proj", "up_proj"),
               "mlp.up_proj": ("gate_proj", "up_proj")}
    for name, w in src.items():
        base = name[:-len(".weight")] if name.endswith(".weight") else None
        if not base or not base.split(".", 3)[-1] in LINEARS:
            out[name] = w.astype(np.float16)
            continue
        key = None
        if a.act_order:
            kind = base.split(".", 3)[-1]
            mates = [base.rsplit(".", 1)[0] + "." + r for r in readers[kind]] if kind in readers else [base]
            key = sum(np.sum(src[m + ".weight"].astype(np.float64) ** 2, axis=0) for m in mates)
        q, s, z, g_idx = quantize(w, a.bits, a.group, sym, key)
        expect[base] = s.astype(np.float32)[g_idx].T * (q - z[g_idx].T)
        if a.method == "gptq":
            out[base + ".qweight"] = pack_fields(q.T, a.bits, 0)
            out[base + ".qzeros"] = pack_fields(z - (0 if a.v2 else 1), a.bits, 1)
            out[base + ".scales"] = s
            out[base + ".g_idx"] = g_idx
        else:
            out[base + ".qweight"] = awq_pack(q.T)
            out[base + ".qzeros"] = awq_pack(z)
            out[base + ".scales"] = s
    save(out, a.out)
    if a.method == "gptq":
        qc = {"quant_method": "gptq", "bits": a.bits, "group_size": a.group, "desc_act": a.act_order, "sym": sym,
              "true_sequential": True, "checkpoint_format": "gptq_v2" if a.v2 else "gptq"}
    else:
        qc = {"quant_method": "awq", "bits": 4, "group_size": a.group, "zero_point": True, "version": "gemm"}
    cfg["quantization_config"] = qc
    cfg["torch_dtype"] = "float16"
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    got = dequantize_dir(a.out)  # the unpacker must read back exactly what was quantized
    for base, e in expect.items():
        if not np.array_equal(got[base + ".weight"], e.astype(np.float32)):
            sys.exit("hf_quant: %s does not unpack to the values packed" % base)
    print("%s: %s %d-bit, group %d%s%s, %d layers packed" % (
        a.out, a.method, a.bits, a.group, " act-order" if a.act_order else "", " sym" if sym else " asym",
        len(expect)), file=sys.stderr)


def dequantize_dir(qdir):
    """The unpacker: every tensor of qdir as float32, packed layers dequantized."""
    cfg = json.load(open(os.path.join(qdir, "config.json")))
    qc = cfg["quantization_config"]
    bits, method = int(qc.get("bits", 4)), qc["quant_method"]
    t = load_file(os.path.join(qdir, "model.safetensors"))
    out = {}
    for name, v in t.items():
        if name.endswith((".qzeros", ".scales", ".g_idx")):
            continue
        if not name.endswith(".qweight"):
            out[name] = v.astype(np.float32)
            continue
        base = name[:-len(".qweight")]
        s = t[base + ".scales"].astype(np.float32)              # [G, N]
        if method == "gptq":
            q = unpack_fields(v, bits, 0)                        # [K, N]
            z = unpack_fields(t[base + ".qzeros"], bits, 1)      # [G, N]
            if qc.get("checkpoint_format", "gptq") == "gptq":
                z = z + 1                                        # v1 stores z-1
            g = t[base + ".g_idx"].astype(np.int64)
        else:
            q = awq_unpack(v)                                    # [K, N]
            z = awq_unpack(t[base + ".qzeros"])
            gs = int(qc["group_size"]) if int(qc["group_size"]) > 0 else q.shape[0]
            g = np.arange(q.shape[0]) // gs
        out[base + ".weight"] = (s[g] * (q - z[g])).T.astype(np.float32)  # [N, K]
    return out


def unpack(a):
    os.makedirs(a.out, exist_ok=True)
    save(dequantize_dir(a.qdir), a.out)
    cfg = json.load(open(os.path.join(a.qdir, "config.json")))
    del cfg["quantization_config"]
    cfg["torch_dtype"] = "float32"
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(a.qdir, f)):
            shutil.copy(os.path.join(a.qdir, f), a.out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--method", choices=["gptq", "awq"], required=True)
    p.add_argument("--bits", type=int, default=4, choices=[4, 8])
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--asym", action="store_true")
    p.add_argument("--act-order", action="store_true")
    p.add_argument("--v2", action="store_true")
    u = sub.add_parser("unpack")
    u.add_argument("qdir")
    u.add_argument("out")
    a = ap.parse_args()
    if a.cmd == "pack":
        if a.method == "awq" and (a.bits != 4 or a.act_order):
            sys.exit("hf_quant: AWQ is 4-bit without act-order")
        pack(a)
    else:
        unpack(a)


if __name__ == "__main__":
    main()
