#!/usr/bin/env python3
"""Pipeline parallelism against one rank, on the same cores.

  pp.py BUILD MODEL [--streams 32] [--prompts 96] [--input 64] [--output 128]
                    [--rounds 3] [--pin 0,1] [--wire shm|tcp|netns]

Three groups, one at a time, each behind its own gateway, pinned to the
same cores (taskset --pin):
  one-t2  one rank, --threads 2: every layer on both cores
  pp2     --pipeline-parallel-size 2, --threads 1: a stage on each core,
          the steps of two virtual engines overlapped
  one-t1  one rank, --threads 1 (the single-stream reference)
Throughput: llmserve bench serve, --prompts random prompts of --input
words and --output tokens (ignore_eos) with --streams in flight; output
tokens per second and TPOT p50, pp2 against one-t2 (the same threads in
all). The stage hop: one stream's TPOT p50 on pp2 less one-t1's (both
compute every layer on one core at a time; the difference is the hop of
the rows to stage 1 and of the logits back, and the turn-taking). Rounds
alternate the modes; medians and each round's ratio are printed.
--wire tcp puts the stages on the TCP backend (--ranks-per-node 1, as on
two hosts) instead of shared memory, over loopback; --wire netns does the
same between two network namespaces on a bridge (tests/e2e/netns.py; root):
stage 1 on node 1, everything else (the references too) on node 0."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from ports import free_port  # noqa: E402
import netns  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--streams", type=int, default=32)
ap.add_argument("--prompts", type=int, default=96)
ap.add_argument("--input", type=int, default=64)
ap.add_argument("--output", type=int, default=128)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--pin", default="0,1")
ap.add_argument("--wire", choices=("shm", "tcp", "netns"), default="shm")
a = ap.parse_args()
HOST, cluster = "127.0.0.1", None
if a.wire == "netns":
    why = netns.available()
    if why:
        sys.exit("pp.py: --wire netns: %s" % why)
    cluster = netns.Cluster(2, tag="llpp%x" % (os.getpid() & 0xfff))
    cluster.up()
    cluster.enter(0)  # this process and what it starts: node 0; stage 1 goes to node 1
    HOST = cluster.addr(0)
build, model = os.path.abspath(a.build), os.path.abspath(a.model)
tmp = tempfile.mkdtemp(prefix="llmserve-pp-bench-")
MODES = {"one-t2": ["--threads", "2"], "one-t1": ["--threads", "1"],
         "pp2": ["--threads", "1", "--pipeline-parallel-size", "2"]}


def ready(port, t=120):
    end = time.time() + t
    while time.time() < end:
        try:
            with urllib.request.urlopen("http://%s:%d/ready" % (HOST, port), timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def bench(port, name, concurrency, prompts):
    out = os.path.join(tmp, name + ".json")
    subprocess.run([build + "/llmserve", "bench", "serve", "--base-url", "http://%s:%d" % (HOST, port),
                    "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--random-input-len",
                    str(a.input), "--random-output-len", str(a.output), "--ignore-eos", "--seed", "7",
                    "--save-result", "--result-dir", tmp, "--result-filename", name + ".json"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.load(open(out))


def run(mode, rnd):
    wp, gp = free_port(), free_port()
    args = ["taskset", "-c", a.pin, build + "/llmserve-worker", "--model", model, "--listen",
            "tcp://%s:%d" % (HOST, wp), "--max-model-len", "1024", "--max-num-seqs", str(max(a.streams, 8)),
            "--log-level", "warn"] + MODES[mode]
    if mode == "pp2" and a.wire != "shm":
        args += ["--ranks-per-node", "1", "--node-index", "0", "--group-address", "tcp://%s:%d" % (HOST, free_port())]
    logs = open(os.path.join(tmp, "%s-%d.log" % (mode, rnd)), "w")
    procs = [subprocess.Popen(args, stdout=logs, stderr=subprocess.STDOUT)]
    if mode == "pp2" and a.wire != "shm":  # the second "host": stage 1 joins over TCP
        group = args[args.index("--group-address") + 1]
        s1 = ["taskset", "-c", a.pin, build + "/llmserve-worker", "--model", model, "--max-model-len", "1024",
              "--max-num-seqs", str(max(a.streams, 8)), "--log-level", "warn", "--ranks-per-node", "1",
              "--node-index", "1", "--group-address", group] + MODES[mode]
        procs.append(cluster.start(1, s1, os.path.join(tmp, "stage1-%d.log" % rnd)) if cluster else
                     subprocess.Popen(s1, stdout=logs, stderr=subprocess.STDOUT))
    procs.append(subprocess.Popen([build + "/llmserve-gateway", "--port", str(gp), "--host", HOST, "--workers",
                                   "tcp://%s:%d" % (HOST, wp), "--reply-address", "tcp://%s:0" % HOST,
                                   "--log-level", "warn"], stdout=logs, stderr=subprocess.STDOUT))
    try:
        if not ready(gp):
            sys.exit("pp.py: %s did not come up (log in %s)" % (mode, tmp))
        r = {}
        if mode != "one-t1":
            bench(gp, "warm-%s-%d" % (mode, rnd), a.streams, a.streams)
            b = bench(gp, "%s-%d" % (mode, rnd), a.streams, a.prompts)
            r["tok_s"], r["tpot"] = b["output_throughput"], b["median_tpot_ms"]
        if mode != "one-t2":
            b = bench(gp, "single-%s-%d" % (mode, rnd), 1, 6)
            r["tpot1"] = b["median_tpot_ms"]
        return r
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
cpu = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
print("cpu: %s; cores %s; %d streams, %d prompts of %d words, %d tokens out; stages over %s" %
      (cpu, a.pin, a.streams, a.prompts, a.input, a.output, a.wire), flush=True)
res = {m: [] for m in MODES}
try:
    for rnd in range(a.rounds):
        order = list(MODES) if rnd % 2 == 0 else list(reversed(list(MODES)))
        for m in order:
            res[m].append(run(m, rnd))
        t2, pp, t1 = res["one-t2"][-1], res["pp2"][-1], res["one-t1"][-1]
        print("round %d: one-t2 %.1f tok/s (TPOT %.1f ms), pp2 %.1f tok/s (TPOT %.1f ms) = %.2fx; one stream TPOT "
              "pp2 %.2f ms, one-t1 %.2f ms: hop %+.2f ms" % (rnd + 1, t2["tok_s"], t2["tpot"], pp["tok_s"], pp["tpot"],
                                                           pp["tok_s"] / t2["tok_s"], pp["tpot1"], t1["tpot1"],
                                                           pp["tpot1"] - t1["tpot1"]), flush=True)
finally:
    if cluster:
        cluster.down()
med = lambda m, k: statistics.median(r[k] for r in res[m])  # noqa: E731
ratios = [p["tok_s"] / o["tok_s"] for p, o in zip(res["pp2"], res["one-t2"])]
hops = [p["tpot1"] - o["tpot1"] for p, o in zip(res["pp2"], res["one-t1"])]
print("median: one-t2 %.1f tok/s, pp2 %.1f tok/s; ratio %.2fx (rounds: %s); TPOT at %d streams %.1f vs %.1f ms; "
      "one stream's stage hop %+.2f ms on %.2f ms (rounds: %s)" %
      (med("one-t2", "tok_s"), med("pp2", "tok_s"), statistics.median(ratios), ", ".join("%.2f" % r for r in ratios),
       a.streams, med("pp2", "tpot"), med("one-t2", "tpot"), statistics.median(hops), med("one-t1", "tpot1"),
       ", ".join("%+.2f" % h for h in hops)))
