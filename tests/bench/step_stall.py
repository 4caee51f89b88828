#!/usr/bin/env python3
"""How long a long prompt stalls a running stream, per --max-step-ms.

  step_stall.py BUILD MODEL [--prompt-words N] [--step-ms 0,250] [--runs 2]

For each value: a worker and a gateway, one stream of 300 tokens, and 1 s
later a prompt of about 3.8 tokens a word (each run starts differently, so
nothing of it is cached). Prints the stream's median and longest gap between
events, and how long the prompt took. Medians over --runs."""
import argparse, http.client, json, os, socket, statistics, subprocess, tempfile, threading, time
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--prompt-words", type=int, default=500)  # about 1,900 tokens
ap.add_argument("--step-ms", default="0,250")
ap.add_argument("--runs", type=int, default=2)
a = ap.parse_args()
build, model = os.path.abspath(a.build), os.path.abspath(a.model)


def stream(port, gaps):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 300, "stream": True,
                                                     "ignore_eos": True}), {"Content-Type": "application/json"})
    r, last = c.getresponse(), None
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data:"):
            now = time.time()
            if last:
                gaps.append(now - last)
            last = now
            if b"[DONE]" in line:
                break


tmp = tempfile.mkdtemp(prefix="llmserve-stall-")
for ms in a.step_ms.split(","):
    wp, gp = free_port(), free_port()
    w = subprocess.Popen([build + "/llmserve-worker", "--model", model, "--listen", "tcp://127.0.0.1:%d" % wp,
                          "--kv-cache-memory", "256MiB", "--log-level", "warn", "--max-step-ms", ms],
                         stdout=open(os.path.join(tmp, "w.log"), "w"), stderr=subprocess.STDOUT)
    g = subprocess.Popen([build + "/llmserve-gateway", "--port", str(gp), "--workers", "tcp://127.0.0.1:%d" % wp,
                          "--no-log-requests"], stdout=open(os.path.join(tmp, "g.log"), "w"), stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", gp, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    med, worst, took = [], [], []
    for run in range(a.runs):
        gaps = []
        th = threading.Thread(target=stream, args=(gp, gaps))
        th.start()
        time.sleep(1.0)
        words = "Run %d: " % run + " ".join("word%d" % i for i in range(a.prompt_words))  # new first block: uncached
        t = time.time()
        c = http.client.HTTPConnection("127.0.0.1", gp, timeout=600)
        c.request("POST", "/v1/completions", json.dumps({"prompt": words, "max_tokens": 1}),
                  {"Content-Type": "application/json"})
        d = json.loads(c.getresponse().read())
        took.append(time.time() - t)
        th.join()
        med.append(statistics.median(gaps) * 1e3)
        worst.append(max(gaps) * 1e3)
        n = d.get("usage", {}).get("prompt_tokens")
    print("--max-step-ms %s: a %s-token prompt took %.2f s; the stream's gaps: median %.1f ms, longest %.0f ms "
          "(medians of %d runs)" % (ms, n, statistics.median(took), statistics.median(med), statistics.median(worst),
                                    a.runs))
    g.terminate()
    w.terminate()
    g.wait()
    w.wait()
