#!/usr/bin/env python3
"""Random PEFT LoRA adapters for a GGUF model's shape, for lora_bench.sh.

    lora_adapters.py MODEL.gguf OUTDIR N [RANK]

N adapters (OUTDIR/lora-0 ...), rank RANK (default 16), on all seven
projections of every layer, F16 as PEFT saves them."""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from safetensors.numpy import save_file

path, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank = int(sys.argv[4]) if len(sys.argv) > 4 else 16
r = GGUFReader(path)
arch = r.fields["general.architecture"].contents()
f = lambda k: int(r.fields["%s.%s" % (arch, k)].contents())
D, L, H, NH = f("embedding_length"), f("block_count"), f("feed_forward_length"), f("attention.head_count")
NKV = f("attention.head_count_kv") if "%s.attention.head_count_kv" % arch in r.fields else NH
hd = D // NH
mods = {"self_attn.q_proj": (NH * hd, D), "self_attn.k_proj": (NKV * hd, D), "self_attn.v_proj": (NKV * hd, D),
        "self_attn.o_proj": (D, NH * hd), "mlp.gate_proj": (H, D), "mlp.up_proj": (H, D), "mlp.down_proj": (D, H)}
for i in range(n):
    g = np.random.default_rng(i)
    d = os.path.join(out, "lora-%d" % i)
    os.makedirs(d, exist_ok=True)
    ts = {}
    for l in range(L):
        for m, (no, ni) in mods.items():
            p = "base_model.model.model.layers.%d.%s." % (l, m)
            ts[p + "lora_A.weight"] = (g.standard_normal((rank, ni)) / np.sqrt(ni)).astype(np.float16)
            ts[p + "lora_B.weight"] = (g.standard_normal((no, rank)) * 0.01).astype(np.float16)
    save_file(ts, os.path.join(d, "adapter_model.safetensors"))
    json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
               "target_modules": [m.split(".")[1] for m in mods]}, open(os.path.join(d, "adapter_config.json"), "w"))
print("%d adapters of rank %d for %s (%d layers) in %s" % (n, rank, arch, L, out))
