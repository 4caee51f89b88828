#!/usr/bin/env python3
"""Does a batch job leave interactive users alone? 8 interactive streams'
TTFT with and without a 1,000-request batch running, side by side.

  batch_interactive.py BUILD MODEL [--lines 1000] [--streams 8] [--rounds 6]
                       [--batch-concurrency 4] [--threads 2]

One worker group and one gateway. Phase 1: the 8 streams (each a loop of
short chat requests, streamed, 32 tokens) alone for --rounds requests each.
Phase 2: a batch of --lines chat requests (each 32 tokens) is created, and
the same 8 streams run again while it runs; then the batch is waited for.
Prints the streams' TTFT p50 / p90 in both phases and their ratio (the goal:
p50 within 1.5x), the batch's requests per second while sharing, and the
interactive output tokens per second in both phases. Greedy; each stream's
prompts differ (and differ between the phases), so the prefix cache helps
each phase alike."""
import argparse
import http.client
import io
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--lines", type=int, default=1000)
ap.add_argument("--streams", type=int, default=8)
ap.add_argument("--rounds", type=int, default=6)
ap.add_argument("--batch-concurrency", type=int, default=4)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
build, model = os.path.abspath(a.build), os.path.abspath(a.model)


tmp = tempfile.mkdtemp(prefix="llmserve-batchbench-")
wp, gp = free_port(), free_port()
procs = [subprocess.Popen([build + "/llmserve-worker", "--model", model, "--listen", "tcp://127.0.0.1:%d" % wp,
                           "--kv-cache-memory", "512MiB", "--threads", str(a.threads), "--log-level", "warn"],
                          stdout=open(os.path.join(tmp, "w.log"), "w"), stderr=subprocess.STDOUT),
         subprocess.Popen([build + "/llmserve-gateway", "--port", str(gp), "--workers", "tcp://127.0.0.1:%d" % wp,
                           "--files-dir", os.path.join(tmp, "files"), "--batch-concurrency", str(a.batch_concurrency),
                           "--no-log-requests", "--log-level", "warn"],
                          stdout=open(os.path.join(tmp, "g.log"), "w"), stderr=subprocess.STDOUT)]


def call(method, path, body=None, ctype="application/json"):
    c = http.client.HTTPConnection("127.0.0.1", gp, timeout=600)
    c.request(method, path, body, {"Content-Type": ctype} if body is not None else {})
    r = c.getresponse()
    d = r.read()
    return r.status, d


for _ in range(300):
    try:
        if call("GET", "/health")[0] == 200:
            break
    except OSError:
        pass
    time.sleep(0.2)
model_id = json.loads(call("GET", "/v1/models")[1])["data"][0]["id"]
TOPICS = ["rivers", "mountains", "birds", "ships", "trees", "stars", "bridges", "cities", "songs", "stones"]


def stream_once(i, r, phase):
    body = {"model": model_id, "messages": [{"role": "user", "content": "%s stream %d round %d: tell me about %s." % (
        phase, i, r, TOPICS[(i + r) % len(TOPICS)])}], "max_tokens": 32, "temperature": 0, "stream": True, "ignore_eos": True}
    c = http.client.HTTPConnection("127.0.0.1", gp, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp, first, n = c.getresponse(), None, 0
    while True:
        line = resp.readline()
        if not line or b"[DONE]" in line:
            break
        if line.startswith(b"data: {") and b'"content"' in line:
            n += 1
            first = first or time.time() - t0
    return first, n


def interactive(phase):
    ttft, tokens = [], [0]
    lock = threading.Lock()

    def user(i):
        for r in range(a.rounds):
            f, n = stream_once(i, r, phase)
            with lock:
                ttft.append(f)
                tokens[0] += n

    t0 = time.time()
    th = [threading.Thread(target=user, args=(i,)) for i in range(a.streams)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return ttft, tokens[0] / (time.time() - t0)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


try:
    stream_once(99, 0, "Warm")
    alone, tps_alone = interactive("Alone")
    lines = [json.dumps({"custom_id": "b%d" % i, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": model_id, "messages": [{"role": "user", "content": "Item %d: one fact about %s."
                                                                   % (i, TOPICS[i % len(TOPICS)])}],
                                  "max_tokens": 32, "temperature": 0, "ignore_eos": True}}) for i in range(a.lines)]
    bnd = "llmservebench"
    form = ("--%s\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--%s\r\nContent-Disposition: "
            "form-data; name=\"file\"; filename=\"b.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n%s\r\n--%s--\r\n"
            % (bnd, bnd, "\n".join(lines), bnd))
    st, d = call("POST", "/v1/files", form.encode(), "multipart/form-data; boundary=" + bnd)
    fid = json.loads(d)["id"]
    st, d = call("POST", "/v1/batches", json.dumps({"input_file_id": fid, "endpoint": "/v1/chat/completions",
                                                    "completion_window": "24h"}))
    bid = json.loads(d)["id"]
    t_batch = time.time()
    time.sleep(2)  # the batch at full flow first
    b0 = json.loads(call("GET", "/v1/batches/" + bid)[1])["request_counts"]["completed"]
    t1 = time.time()
    shared, tps_shared = interactive("Shared")
    b1 = json.loads(call("GET", "/v1/batches/" + bid)[1])["request_counts"]["completed"]
    batch_rps_shared = (b1 - b0) / (time.time() - t1)
    while True:
        b = json.loads(call("GET", "/v1/batches/" + bid)[1])
        if b["status"] in ("completed", "failed", "cancelled", "expired"):
            break
        time.sleep(0.5)
    took = time.time() - t_batch
    p50a, p50b = statistics.median(alone), statistics.median(shared)
    print("interactive: %d streams x %d requests (32 tokens each), batch: %d requests of 32 tokens, "
          "--batch-concurrency %d, %d threads" % (a.streams, a.rounds, a.lines, a.batch_concurrency, a.threads))
    print("TTFT p50 alone %.0f ms, with the batch %.0f ms: %.2fx (goal <= 1.5x)" % (p50a * 1e3, p50b * 1e3, p50b / p50a))
    print("TTFT p90 alone %.0f ms, with the batch %.0f ms" % (pct(alone, 0.9) * 1e3, pct(shared, 0.9) * 1e3))
    print("interactive output tok/s alone %.1f, with the batch %.1f" % (tps_alone, tps_shared))
    print("batch: %s, %d completed, %d failed in %.1f s; %.1f requests/s while sharing"
          % (b["status"], b["request_counts"]["completed"], b["request_counts"]["failed"], took, batch_rps_shared))
finally:
    for p in procs:
        p.terminate()
        p.wait()
