#!/usr/bin/env python3
"""The tiered KV cache against recomputation: TTFT when the working set of
prefixes is 4x the KV pool.

  kv_tiers.py BUILD MODEL [--prefixes 64] [--prefix-tokens 1500] [--requests 64]
              [--threads 2] [--modes none,memory,disk]

--prefixes distinct prefixes of --prefix-tokens token ids each (each
request: a prefix and 8 tokens of its own, 8 greedy tokens out). The KV pool
holds a quarter of them. One worker group and one gateway per mode, one
after the other in this run:
  none    the pool alone (what a block evicted is recomputed)
  memory  the pool and --kv-offloading-size large enough for the working set
  disk    the pool and a disk tier only (--kv-offloading-dir, no memory tier)
  both    the pool, a memory tier as large as the pool, and the disk tier (blocks
          on disk are read ahead into memory off the engine's thread)
Each mode: every prefix once (the tiers fill), then --requests requests in a
random order (the same order in every mode), measured: TTFT p50 / p90 (to the
first streamed token) and the prefix tokens found cached. Prints the ratios
against `none` and whether every greedy answer is the same in every mode."""
import argparse
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--prefixes", type=int, default=64)
ap.add_argument("--prefix-tokens", type=int, default=1500)
ap.add_argument("--requests", type=int, default=64)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--modes", default="none,memory,disk,both")
a = ap.parse_args()
build, model = os.path.abspath(a.build), os.path.abspath(a.model)
KV_PER_TOKEN = 23040  # SmolLM2-135M, f16 (the worker logs it); the pool is sized from it
pool = a.prefixes * a.prefix_tokens * KV_PER_TOKEN // 4
rng = random.Random(7)
prefixes = [[rng.randrange(1000, 40000) for _ in range(a.prefix_tokens)] for _ in range(a.prefixes)]
order = [rng.randrange(a.prefixes) for _ in range(a.requests)]


def run(mode):
    tmp = tempfile.mkdtemp(prefix="llmserve-kvbench-")
    wp, gp = free_port(), free_port()
    extra = {"none": [], "memory": ["--kv-offloading-size", "%dMiB" % (pool * 5 // 1048576)],
             "disk": ["--kv-offloading-dir", os.path.join(tmp, "kv")],
             "both": ["--kv-offloading-size", "%dMiB" % (pool // 1048576), "--kv-offloading-dir", os.path.join(tmp, "kv")]}[mode]
    procs = [subprocess.Popen([build + "/llmserve-worker", "--model", model, "--listen", "tcp://127.0.0.1:%d" % wp,
                               "--kv-cache-memory", str(pool), "--max-model-len", str(a.prefix_tokens + 32), "--threads", str(a.threads),
                               "--log-level", "warn"] + extra,
                              stdout=open(os.path.join(tmp, "w.log"), "w"), stderr=subprocess.STDOUT),
             subprocess.Popen([build + "/llmserve-gateway", "--port", str(gp), "--workers", "tcp://127.0.0.1:%d" % wp,
                               "--no-log-requests", "--log-level", "warn"],
                              stdout=open(os.path.join(tmp, "g.log"), "w"), stderr=subprocess.STDOUT)]
    try:
        for _ in range(600):
            if procs[0].poll() is not None:
                sys.exit("kv_tiers: the worker exited: %s" % open(os.path.join(tmp, "w.log")).read()[-400:])
            try:
                c = http.client.HTTPConnection("127.0.0.1", gp, timeout=5)
                c.request("GET", "/ready")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        c = http.client.HTTPConnection("127.0.0.1", gp, timeout=10)
        c.request("GET", "/v1/models")
        mid = json.loads(c.getresponse().read())["data"][0]["id"]

        def one(i, k):
            body = {"model": mid, "prompt": prefixes[i] + [500 + k % 97, 600, 700, 800, 900, 950, 960, 970],
                    "max_tokens": 8, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
            c = http.client.HTTPConnection("127.0.0.1", gp, timeout=600)
            t0 = time.time()
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            ttft, text, cached = None, "", 0
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if d.get("choices") and d["choices"][0].get("text") is not None and ttft is None:
                    ttft = time.time() - t0
                if d.get("choices"):
                    text += d["choices"][0].get("text") or ""
                if d.get("usage"):
                    cached = (d["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            return ttft, text, cached

        for i in range(a.prefixes):  # the working set, once: what the tiers keep
            one(i, i)
        res = [one(i, 1000 + k) for k, i in enumerate(order)]
        return {"ttft": [r[0] for r in res], "text": [r[1] for r in res], "cached": [r[2] for r in res]}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


print("kv_tiers: %d prefixes of %d tokens (%.0f MiB of K/V), a KV pool of %.0f MiB; %d requests in a random order" %
      (a.prefixes, a.prefix_tokens, a.prefixes * a.prefix_tokens * KV_PER_TOKEN / 1048576, pool / 1048576, a.requests))
out = {}
for m in a.modes.split(","):
    t0 = time.time()
    out[m] = run(m)
    r = out[m]
    print("  %-7s TTFT p50 %7.1f ms  p90 %7.1f ms  cached prefix tokens p50 %5d  (%.0f s)" %
          (m, 1e3 * statistics.median(r["ttft"]), 1e3 * pct(r["ttft"], 0.9), statistics.median(r["cached"]),
           time.time() - t0), flush=True)
if "none" in out:
    base = statistics.median(out["none"]["ttft"])
    for m in out:
        if m != "none":
            print("  %s against none: TTFT p50 %.1fx better" % (m, base / statistics.median(out[m]["ttft"])))
texts = [out[m]["text"] for m in out]
print("  greedy answers identical in every mode: %s" % all(t == texts[0] for t in texts))
