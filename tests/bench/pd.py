#!/usr/bin/env python3
"""Disaggregated prefill and decode against colocated groups, on the same
cores, under a mixed load.

  pd.py BUILD MODEL [--streams 16] [--long-min 2000] [--long-max 4000]
                    [--long-every 15] [--seconds 120] [--decode-step-ms 50]
                    [--modes colocated,colocated-tight,pd]

The load: --streams clients, each streaming one chat-sized request after
another (a prompt of 32 to 96 token ids, 64 to 192 tokens out, ignore_eos;
the clients start 0.2 s apart), while a
long prompt of --long-min to --long-max token ids (16 tokens out) arrives
every --long-every seconds, for --seconds. The same prompts in the same order
in both modes. Each mode runs its two worker groups on the same two cores,
one core each (taskset, --threads 1):
  colocated  two kv_both groups: each prefills and decodes what the router
             gives it
  colocated-tight  the same with --max-step-ms --decode-step-ms (50): short
             steps bought with slower prefill
  pd         one kv_producer group (core 0) and one kv_consumer group
             (core 1), both with --max-step-ms --decode-step-ms: long
             prompts are prefilled on the producer (whole chunks) and their
             KV sent to the consumer, which decodes; while no long prompt is
             there, the producer prefills short prompts and decodes up to
             half the streams (the gateway's --idle-decode), and a long
             prompt moves those streams to the consumer first
Measured at the client: the streams' inter-token latency (each gap between
two streamed tokens) p50 / p99, the long prompts' TTFT p50 / p90, and the
output tokens per second of everything. Then one greedy check: the answers
to the same long prompts in both modes must be identical."""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--streams", type=int, default=16)
ap.add_argument("--long-min", type=int, default=2000)
ap.add_argument("--long-max", type=int, default=4000)
ap.add_argument("--long-every", type=float, default=15.0)
ap.add_argument("--seconds", type=float, default=120.0)
ap.add_argument("--modes", default="colocated,colocated-tight,pd")
ap.add_argument("--decode-step-ms", type=int, default=50)
a = ap.parse_args()
build, model = os.path.abspath(a.build), os.path.abspath(a.model)
rng = random.Random(11)
n_long = int(a.seconds / a.long_every)
longs = [[rng.randrange(1000, 40000) for _ in range(rng.randrange(a.long_min, a.long_max + 1))] for _ in range(n_long)]
# chat-sized requests of varied lengths, so the streams do not start and end in step
shorts = [([rng.randrange(1000, 40000) for _ in range(rng.randrange(32, 97))], rng.randrange(64, 193))
          for _ in range(4096)]
MODEL_ID = [None]
cores = os.sched_getaffinity(0)
c0, c1 = sorted(cores)[0], sorted(cores)[-1]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] if xs else float("nan")


def stream(port, toks, max_tokens, out):
    """One streamed completion: appends (t_sent, [t of each token], token text) to out."""
    body = {"model": MODEL_ID[0], "prompt": toks, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    times, text = [], ""
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            ev = ev.decode()
            if not ev.startswith("data: ") or ev == "data: [DONE]":
                continue
            d = json.loads(ev[6:])
            if d.get("choices") and d["choices"][0].get("text"):
                times.append(time.time())
                text += d["choices"][0]["text"]
    c.close()
    out.append((t0, times, text))


def run(mode):
    tmp = tempfile.mkdtemp(prefix="llmserve-pdbench-")
    wp = [free_port(), free_port()]
    hp = [free_port(), free_port()]
    gport = free_port()
    roles = {"colocated": [None, None], "colocated-tight": [None, None],
             "pd": ['{"kv_role": "kv_producer"}', '{"kv_role": "kv_consumer"}']}[mode]
    procs = []
    for i, (port, core) in enumerate(zip(wp, (c0, c1))):
        args = ["taskset", "-c", str(core), build + "/llmserve-worker", "--model", model, "--listen",
                "tcp://127.0.0.1:%d" % port, "--max-model-len", str(a.long_max + 64), "--max-num-seqs", "32",
                "--kv-cache-memory", "1GiB", "--threads", "1", "--log-level", "warn", "--health-port", str(hp[i]),
                "--health-host", "127.0.0.1"]
        if roles[i]:
            args += ["--kv-transfer-config", roles[i]]
        # a decode group keeps its steps short (its prompts are short), and so does the prefill group while it
        # decodes (--idle-decode; its prefills alone run whole chunks); colocated-tight tries the same on groups
        # that prefill everything
        if roles[i] or mode == "colocated-tight":
            args += ["--max-step-ms", str(a.decode_step_ms)]
        procs.append(subprocess.Popen(args, stdout=open(os.path.join(tmp, "w%d.log" % i), "w"), stderr=subprocess.STDOUT))
    procs.append(subprocess.Popen([build + "/llmserve-gateway", "--port", str(gport), "--host", "127.0.0.1",
                                   "--workers", ",".join("tcp://127.0.0.1:%d" % p for p in wp), "--log-level", "warn",
                                   "--max-local-prefill-length", "512", "--request-timeout", "600",
                                   "--ttft-timeout", "600"],
                                  stdout=open(os.path.join(tmp, "g.log"), "w"), stderr=subprocess.STDOUT))
    try:
        end = time.time() + 120
        while time.time() < end:
            try:
                c = http.client.HTTPConnection("127.0.0.1", gport, timeout=2)
                c.request("GET", "/v1/models")
                body = json.loads(c.getresponse().read())
                if body.get("data"):
                    MODEL_ID[0] = body["data"][0]["id"]
                    # both groups up: the metrics list each as up
                    c.request("GET", "/metrics")
                    m = c.getresponse().read().decode()
                    if m.count("llmserve:worker_up{") == 2 and " 0\n" not in "".join(
                            l + "\n" for l in m.splitlines() if l.startswith("llmserve:worker_up{")):
                        break
            except (OSError, ValueError):
                pass
            time.sleep(0.3)
        streams, long_out = [], []
        stop = time.time() + a.seconds
        nxt = [0]
        lock = threading.Lock()

        def client(k):
            time.sleep(k * 0.2)
            while time.time() < stop:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                p, n = shorts[i % len(shorts)]
                stream(gport, p, n, streams)

        def longs_arrive():
            t_start = time.time()
            ths = []
            for i, p in enumerate(longs):
                time.sleep(max(0.0, t_start + i * a.long_every - time.time()))
                th = threading.Thread(target=stream, args=(gport, p, 16, long_out))
                th.start()
                ths.append(th)
            for th in ths:
                th.join()

        t0 = time.time()
        ths = [threading.Thread(target=client, args=(k,)) for k in range(a.streams)]
        lt = threading.Thread(target=longs_arrive)
        for th in ths:
            th.start()
        lt.start()
        for th in ths:
            th.join()
        lt.join()
        wall = time.time() - t0
        itl = [b - a_ for _, ts, _ in streams for a_, b in zip(ts, ts[1:])]
        sttft = [ts[0] - t for t, ts, _ in streams if ts]
        ttft = [ts[0] - t for t, ts, _ in long_out if ts]
        toks = sum(len(ts) for _, ts, _ in streams) + sum(len(ts) for _, ts, _ in long_out)
        steps, xfer = [], None
        for port in hp:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/metrics")
            m = c.getresponse().read().decode()
            v = {l.split()[0]: float(l.split()[-1]) for l in m.splitlines() if l and not l.startswith("#")}
            steps.append((v.get('llmserve:worker_step_ms_p50{model_name="%s"}' % MODEL_ID[0]),
                          v.get('llmserve:worker_step_ms_p99{model_name="%s"}' % MODEL_ID[0])))
            n_x = v.get('llmserve:kv_transfer_seconds_count{model_name="%s"}' % MODEL_ID[0])
            if n_x:
                xfer = (n_x, 1e3 * v['llmserve:kv_transfer_seconds_sum{model_name="%s"}' % MODEL_ID[0]] / n_x)
            if os.environ.get("PD_DEBUG"):
                print({k: x for k, x in v.items() if "kv_transfer" in k or "external" in k or "prefix_cache" in k})
        c = http.client.HTTPConnection("127.0.0.1", gport, timeout=5)
        c.request("GET", "/metrics")
        gm = {l.split()[0]: float(l.split()[-1]) for l in c.getresponse().read().decode().splitlines()
              if l and not l.startswith("#")}
        split = [int(gm.get("llmserve:disagg_" + k + "_total", 0))
                 for k in ("prefill_requests", "handoffs", "idle_decodes", "idle_decodes_moved")]
        # the greedy answers to the long prompts, each alone (the same in both modes)
        check = []
        for p in longs[:3]:
            out = []
            stream(gport, p, 16, out)
            check.append(out[0][2])
        return {"itl50": pct(itl, 50) * 1e3, "itl99": pct(itl, 99) * 1e3, "ttft50": pct(ttft, 50),
                "sttft50": pct(sttft, 50) * 1e3,
                "ttft90": pct(ttft, 90), "tps": toks / wall, "streams": len(streams), "longs": len(ttft),
                "check": check, "steps": steps, "xfer": xfer, "split": split}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


res = {}
for mode in a.modes.split(","):
    res[mode] = run(mode)
    r = res[mode]
    print("%-15s ITL p50 %5.1f ms  p99 %5.1f ms | TTFT p50: streams %5.0f ms, long %5.2f s (p90 %5.2f s) | "
          "%5.1f tok/s out (%d streamed requests, %d long prompts)" %
          (mode, r["itl50"], r["itl99"], r["sttft50"], r["ttft50"], r["ttft90"], r["tps"], r["streams"], r["longs"]),
          flush=True)
    print("           worker steps (last 1024), ms p50/p99: %s%s" % ("; ".join("%.1f/%.1f" % x for x in r["steps"]),
          "; %d transfers adopted, %.2f ms after their last message left (mean)" % r["xfer"] if r["xfer"] else ""))
    if r["split"][0]:
        print("           the gateway: %d requests to the producer, %d handed over after their first token, %d "
              "decoded there (--idle-decode), %d of those moved by a long prompt" % tuple(r["split"]))
if "colocated" in res and "pd" in res:
    c, p = res["colocated"], res["pd"]
    print("pd vs colocated: ITL p99 %.2fx better; TTFT p50 %.2fx (long prompts), %.2fx (streams) (above 1: pd "
          "faster); output tok/s %.2fx; greedy answers %s" %
          (c["itl99"] / p["itl99"], c["ttft50"] / p["ttft50"], c["sttft50"] / p["sttft50"], p["tps"] / c["tps"],
           "identical" if all(r["check"] == c["check"] for r in res.values()) else "DIFFER"))
