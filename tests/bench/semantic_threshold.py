#!/usr/bin/env python3
"""The semantic cache's threshold risk, measured: how often a similarity
threshold would serve the answer to a different question (false hits) and
how often it would reuse the answer to the same question reworded (hits).

tests/data/paraphrase_pairs.jsonl holds labelled pairs written by hand for
this (same=true: a rewording; same=false: a different question, most of them
near misses on purpose: the same template with another entity or intent).
Each question is embedded with `llmserve embed` (the encoder the cache
uses); the cosine of each pair is what the cache compares with
--semantic-cache-threshold.

    python3 tests/bench/semantic_threshold.py BUILD/llmserve MODEL_DIR [--pairs FILE] [--check T MAX_FALSE MIN_HITS]

prints a table by threshold; --check exits 1 unless at threshold T the
false-hit rate is at most MAX_FALSE and the hit rate at least MIN_HITS (the
ctest that keeps docs/tuning.md's figures true)."""
import argparse
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("llmserve")
    ap.add_argument("model")
    ap.add_argument("--pairs", default=os.path.join(HERE, "..", "data", "paraphrase_pairs.jsonl"))
    ap.add_argument("--check", nargs=3, type=float, metavar=("T", "MAX_FALSE", "MIN_HITS"))
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        print("embedding model %s not found (tools/setup.sh fetches it); skipped" % a.model)
        sys.exit(77)
    pairs = [json.loads(l) for l in open(a.pairs) if '"a"' in l]
    texts = sorted({p["a"] for p in pairs} | {p["b"] for p in pairs})
    out = subprocess.run([a.llmserve, "embed", "--model", a.model, "--file", "-"], input="\n".join(texts) + "\n",
                         capture_output=True, text=True, check=True).stdout
    vec = {texts[r["index"]]: r["embedding"] for r in map(json.loads, out.splitlines())}

    def cos(x, y):
        u, v = vec[x], vec[y]
        return sum(i * j for i, j in zip(u, v)) / math.sqrt(sum(i * i for i in u) * sum(j * j for j in v))

    pos = sorted(cos(p["a"], p["b"]) for p in pairs if p["same"])
    neg = sorted(cos(p["a"], p["b"]) for p in pairs if not p["same"])
    print("%d pairs: %d rewordings, %d different questions; %d questions embedded" % (len(pairs), len(pos), len(neg), len(texts)))
    print("rewordings: cosine median %.3f, min %.3f; different questions: median %.3f, max %.3f"
          % (pos[len(pos) // 2], pos[0], neg[len(neg) // 2], neg[-1]))
    print("| threshold | false hits (different question answered) | hits (rewording answered) |")
    print("|---:|---:|---:|")
    rates = {}
    for t in [0.70, 0.75, 0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99]:
        fh = sum(c >= t for c in neg)
        h = sum(c >= t for c in pos)
        rates[round(t, 2)] = (fh / len(neg), h / len(pos))
        print("| %.2f | %d of %d (%.1f%%) | %d of %d (%.1f%%) |" % (t, fh, len(neg), 100.0 * fh / len(neg), h, len(pos),
                                                               100.0 * h / len(pos)))
    worst = sorted(((cos(p["a"], p["b"]), p["a"], p["b"]) for p in pairs if not p["same"]), reverse=True)[:5]
    print("closest different questions:")
    for c, x, y in worst:
        print("  %.3f  %s | %s" % (c, x, y))
    if a.check:
        t, max_false, min_hits = a.check
        fh = sum(c >= t for c in neg) / len(neg)
        h = sum(c >= t for c in pos) / len(pos)
        ok = fh <= max_false and h >= min_hits
        print("check at %.2f: false hits %.3f (at most %.3f), hits %.3f (at least %.3f): %s"
              % (t, fh, max_false, h, min_hits, "ok" if ok else "FAILED"))
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
