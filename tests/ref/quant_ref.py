#!/usr/bin/env python3
"""Golden values for the GGUF block formats, decoded by the gguf Python package (llama.cpp's own
reader), for quant_test: random blocks of every type we load, with sane fp16 scales, and their
dequantized elements.

    quant_ref.py OUT.bin

OUT: "LQNT", u32 count, then per type: u32 type, u32 blocks, the raw bytes, and the float32 values."""
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

# fp16 fields of each block (byte offsets): set to moderate scales so nothing is NaN or infinite
HALVES = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q2_K: [80, 82],
          T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def main(out):
    rng = np.random.default_rng(20261203)
    parts = []
    for t, halves in HALVES.items():
        blk, size = quants.GGML_QUANT_SIZES[t]
        nblocks = 4096 // blk  # 4,096 elements of each
        raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
        for off in halves:
            h = (rng.uniform(0.001, 0.05, nblocks) * rng.choice([-1, 1], nblocks)).astype(np.float16)
            raw[:, off:off + 2] = h.view(np.uint8).reshape(nblocks, 2)
        vals = quants.dequantize(raw.reshape(-1), t).astype(np.float32).reshape(-1)
        assert vals.size == nblocks * blk and np.all(np.isfinite(vals))
        parts.append(struct.pack("<II", int(t), nblocks) + raw.tobytes() + vals.tobytes())
    with open(out, "wb") as f:
        f.write(b"LQNT" + struct.pack("<I", len(parts)) + b"".join(parts))


if __name__ == "__main__":
    main(sys.argv[1])
