#!/usr/bin/env python3
"""TPOT with and without a structured-output constraint, side by side.

  structured_bench.py BUILD MODEL [--runs N] [--max-tokens M] [--concurrency C]

Starts one worker and one gateway on loopback, then alternates streamed
chat requests (the same prompt, temperature 1, ignore_eos off) plain, with
response_format json_object, and with a JSON Schema; each round sends C at
once. TPOT of a stream is (last token - first token) / (tokens - 1); the
figures are medians over every stream of a mode. Also prints the time the
gateway takes to compile the schema (its p50 over the runs is in the
request latency; the worker compiles each distinct grammar once)."""
import argparse, http.client, json, os, socket, statistics, subprocess, sys, tempfile, threading, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--runs", type=int, default=12)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--concurrency", type=int, default=1)
a = ap.parse_args()


tmp = tempfile.mkdtemp(prefix="llmserve-sbench-")
wp, gp = free_port(), free_port()
procs = [subprocess.Popen([a.build + "/llmserve-worker", "--model", a.model, "--listen", "tcp://127.0.0.1:%d" % wp,
                           "--kv-cache-memory", "512MiB", "--max-model-len", "2048", "--log-level", "info"],
                          stdout=open(os.path.join(tmp, "worker.log"), "w"), stderr=subprocess.STDOUT),
         subprocess.Popen([a.build + "/llmserve-gateway", "--port", str(gp), "--workers", "tcp://127.0.0.1:%d" % wp,
                           "--log-level", "warn"], stdout=open(os.path.join(tmp, "gateway.log"), "w"),
                          stderr=subprocess.STDOUT)]
try:
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", gp, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    SCHEMA = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 6},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                    "required": ["street", "city"], "additionalProperties": False},
        "bio": {"type": "string"}}, "required": ["name", "age", "hobbies", "address", "bio"],
        "additionalProperties": False}
    MODES = {"plain": {}, "json_object": {"response_format": {"type": "json_object"}},
             "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}}
    msgs = [{"role": "user", "content": "Describe a person in detail, as JSON with name, age, hobbies, address, bio."}]

    def stream(extra, seed, out):
        body = dict(messages=msgs, max_tokens=a.max_tokens, temperature=1.0, seed=seed, stream=True,
                    stream_options={"include_usage": True}, **extra)
        c = http.client.HTTPConnection("127.0.0.1", gp, timeout=120)
        t0 = time.time()
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        times, tokens = [], 0
        for line in r:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                tokens = d["usage"]["completion_tokens"]
            if d.get("choices") and d["choices"][0]["delta"].get("content"):
                times.append(time.time())
        if tokens > 1 and len(times) > 1:
            out.append(((times[-1] - times[0]) / (tokens - 1) * 1e3, (times[0] - t0) * 1e3, tokens))

    res = {m: [] for m in MODES}
    for run in range(a.runs):
        for m, extra in MODES.items():  # interleaved: the machine's noise falls on every mode alike
            out = []
            ts = [threading.Thread(target=stream, args=(extra, 1000 * run + k, out)) for k in range(a.concurrency)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            res[m] += out
    base = statistics.median(x[0] for x in res["plain"])
    print("structured outputs, %d runs x %d concurrent streams, max_tokens %d, temperature 1" %
          (a.runs, a.concurrency, a.max_tokens))
    print("%-12s %10s %10s %10s %8s" % ("mode", "TPOT ms", "vs plain", "TTFT ms", "tokens"))
    for m in MODES:
        tp = statistics.median(x[0] for x in res[m])
        print("%-12s %10.2f %+9.1f%% %10.1f %8.0f" % (m, tp, (tp / base - 1) * 100,
                                                   statistics.median(x[1] for x in res[m]),
                                                   statistics.median(x[2] for x in res[m])))
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()
    with open(os.path.join(tmp, "worker.log")) as f:  # the worker's own count of draws, redraws and masks
        for line in f:
            if "structured outputs:" in line:
                print(line.split("structured outputs:", 1)[1].strip())
