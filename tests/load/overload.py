#!/usr/bin/env python3
"""Overload and soak on loopback: a real worker and gateway, many clients.

  overload.py BUILD MODEL [--duration S] [--clients N] [--max-queue Q]
              [--cancel-fraction F] [--json PATH]

Offers --clients closed-loop clients (default 10x the gateway's admission
capacity, --max-queue) for --duration seconds: streaming and plain
completions of mixed lengths, a --cancel-fraction of them hung up mid-stream.
Then it checks what must hold under overload:
  - refusals are fast (429/503 in well under a second), never hangs;
  - accepted requests finish within their deadline (--request-timeout 30);
  - no request is lost: every one ends with a status, [DONE] or an error;
  - RSS and open file descriptors of both processes stay bounded (the last
    third of the run against the first third);
  - afterwards the server serves a plain request at once.
It prints one line per check and a summary; exit 1 if any check fails. The
soak is the same with a long --duration and cancellations (docs/tuning.md
has the figures). Bounded: loopback only, every socket has a timeout."""
import argparse, http.client, json, os, random, socket, subprocess, sys, tempfile, threading, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--duration", type=float, default=60)
ap.add_argument("--clients", type=int, default=0, help="default: 10x --max-queue")
ap.add_argument("--max-queue", type=int, default=8)
ap.add_argument("--cancel-fraction", type=float, default=0.2)
ap.add_argument("--json", default="")
ap.add_argument("--rss-slack", type=float, default=64,
                help="MiB of growth allowed beyond the KV pool (ASan's quarantine alone keeps 256 MiB of freed memory)")
a = ap.parse_args()
a.build, a.model = os.path.abspath(a.build), os.path.abspath(a.model)
clients = a.clients or 10 * a.max_queue
if not os.path.exists(a.model):
    print("overload: model %s not found: run tools/setup.sh" % a.model)
    sys.exit(77)

KV_MIB = 512


wport, gport = free_port(), free_port()
tmp = tempfile.mkdtemp(prefix="llmserve-load-")
procs = []


def start(args, log):
    p = subprocess.Popen(args, stdout=open(os.path.join(tmp, log), "w"), stderr=subprocess.STDOUT, cwd=tmp)
    procs.append(p)
    return p


w = start([a.build + "/llmserve-worker", "--model", a.model, "--listen", "tcp://127.0.0.1:%d" % wport,
           "--kv-cache-memory", "%dMiB" % KV_MIB, "--max-model-len", "2048", "--log-level", os.environ.get("LLM_WORKER_LOG", "warn")], "worker.log")
g = start([a.build + "/llmserve-gateway", "--port", str(gport), "--workers", "tcp://127.0.0.1:%d" % wport,
           "--max-queue", str(a.max_queue), "--request-timeout", "30", "--no-log-requests"], "gateway.log")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    print(("ok  " if cond else "FAIL") + " " + what, flush=True)


def up():
    t = time.time()
    while time.time() - t < 60:
        try:
            c = http.client.HTTPConnection("127.0.0.1", gport, timeout=2)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def proc_stats(pid):
    rss = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024.0
    return rss, len(os.listdir("/proc/%d/fd" % pid))


prompts = ["Hello", "Tell me a story about a dragon. " * 4, "List the planets. " * 20, "Once upon a time " * 60]
lock = threading.Lock()
res = {"ok": 0, "refused": 0, "cancelled": 0, "error": 0, "lost": 0, "late": 0}
refusal_ms, ok_s, codes, errors = [], [], {}, []
stop = threading.Event()


def one(rng):
    body = {"prompt": rng.choice(prompts), "max_tokens": rng.choice([8, 16, 32, 64]), "stream": rng.random() < 0.6}
    cancel = body["stream"] and rng.random() < a.cancel_fraction
    t = time.time()
    c = http.client.HTTPConnection("127.0.0.1", gport, timeout=45)
    try:
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            r.read()
            with lock:
                codes[r.status] = codes.get(r.status, 0) + 1
                if r.status in (429, 503):
                    res["refused"] += 1
                    refusal_ms.append((time.time() - t) * 1e3)
                else:
                    res["error"] += 1
                    errors.append("HTTP %d" % r.status)
            if r.status in (429, 503):
                time.sleep(rng.uniform(0.02, 0.1))  # a client's retry jitter; Retry-After says 1 s
            return
        if not body["stream"]:
            json.loads(r.read())
            kind = "ok"
        else:
            kind, events = "lost", 0
            while True:
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    events += 1
                    if line.startswith(b"data: [DONE]"):
                        kind = "ok" if kind == "lost" else kind
                        break
                    # an error event has "error" at the top: a completion whose text is "error" is not one
                    if b'"error"' in line and "error" in json.loads(line[6:]):
                        kind = "error"
                        with lock:
                            errors.append(line[6:200].decode(errors="replace").strip())
                    if cancel and events >= 2:
                        kind = "cancelled"
                        break
        dt = time.time() - t
        with lock:
            res[kind] += 1
            if kind == "ok":
                ok_s.append(dt)
                if dt > 30:
                    res["late"] += 1
    except (OSError, ValueError, http.client.HTTPException):
        with lock:
            res["lost"] += 1
    finally:
        c.close()


def client(i):
    rng = random.Random(i)
    while not stop.is_set():
        one(rng)


if not up():
    check(False, "overload: worker and gateway up")
    for name in ("gateway.log", "worker.log"):
        print("---- %s (tail)\n%s" % (name, "".join(open(os.path.join(tmp, name)).readlines()[-15:])))
    for p in procs:
        p.kill()
    sys.exit(1)
check(True, "overload: worker and gateway up")
rss0 = {"gateway": proc_stats(g.pid), "worker": proc_stats(w.pid)}
samples = []
ths = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
t0 = time.time()
for th in ths:
    th.start()
while time.time() - t0 < a.duration:
    time.sleep(min(1.0, a.duration / 10))
    samples.append((time.time() - t0, proc_stats(g.pid), proc_stats(w.pid)))
stop.set()
for th in ths:
    th.join(60)
hung = sum(th.is_alive() for th in ths)
el = time.time() - t0

# afterwards: served at once
t = time.time()
c = http.client.HTTPConnection("127.0.0.1", gport, timeout=30)
c.request("POST", "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 4}), {"Content-Type": "application/json"})
r = c.getresponse()
r.read()
after = (r.status, time.time() - t)

total = sum(res.values())
refusal_ms.sort()
ok_s.sort()
third = max(1, len(samples) // 3)


def growth(idx, k):  # MiB or fds: mean of the last third minus mean of the first third
    first = [s[idx][k] for s in samples[:third]]
    last = [s[idx][k] for s in samples[-third:]]
    return sum(last) / len(last) - sum(first) / len(first)


summary = {
    "duration_s": round(el, 1), "clients": clients, "max_queue": a.max_queue, "requests": total,
    "results": res, "codes": codes, "rps": round(total / el, 1),
    "refusal_ms_p50": round(refusal_ms[len(refusal_ms) // 2], 1) if refusal_ms else None,
    "refusal_ms_max": round(refusal_ms[-1], 1) if refusal_ms else None,
    "ok_s_p50": round(ok_s[len(ok_s) // 2], 2) if ok_s else None, "ok_s_max": round(ok_s[-1], 2) if ok_s else None,
    "gateway_rss_mib": [round(rss0["gateway"][0], 1), round(max(s[1][0] for s in samples), 1)],
    "worker_rss_mib": [round(rss0["worker"][0], 1), round(max(s[2][0] for s in samples), 1)],
    "gateway_rss_growth_mib": round(growth(1, 0), 1), "worker_rss_growth_mib": round(growth(2, 0), 1),
    "gateway_fd_growth": round(growth(1, 1), 1), "worker_fd_growth": round(growth(2, 1), 1),
    "after": {"status": after[0], "s": round(after[1], 3)}, "hung_clients": hung, "errors": errors[:5],
}
print(json.dumps(summary))
check(hung == 0 and res["lost"] == 0, "overload: no request lost or hung (%d lost, %d clients hung)" % (res["lost"], hung))
check(res["refused"] > 0 and summary["refusal_ms_max"] < 1000,
      "overload: refusals are fast (%d refused, p50 %s ms, max %s ms)" % (res["refused"], summary["refusal_ms_p50"],
                                                                          summary["refusal_ms_max"]))
check(res["ok"] > 0 and res["late"] == 0, "overload: %d accepted requests finished, none past the 30 s deadline (max %s s)"
      % (res["ok"], summary["ok_s_max"]))
check(res["error"] == 0, "overload: no errors besides refusals (%d; codes %s; %s)" % (res["error"], codes, errors[:3]))
# the worker's KV pool (512 MiB here) is touched as the prefix cache fills it: its RSS may grow by that much, no more
wmax = summary["worker_rss_mib"][1] - summary["worker_rss_mib"][0]
check(summary["gateway_rss_growth_mib"] < a.rss_slack and wmax < KV_MIB + a.rss_slack,
      "overload: RSS bounded (gateway grew %.1f MiB; worker %.1f MiB, within its %d MiB KV pool + %.0f)"
      % (summary["gateway_rss_growth_mib"], wmax, KV_MIB, a.rss_slack))
check(summary["gateway_fd_growth"] < 32 and summary["worker_fd_growth"] < 32,
      "overload: file descriptors flat (growth gateway %.1f, worker %.1f)" % (summary["gateway_fd_growth"],
                                                                              summary["worker_fd_growth"]))
check(after[0] == 200 and after[1] < 5, "overload: afterwards a request is served in %.2f s (%d)" % (after[1], after[0]))
if a.json:
    with open(a.json, "w") as f:
        json.dump(summary, f, indent=1)
for p in procs:
    p.terminate()
for p in procs:
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
print("overload: %d checks failed" % len(failures))
if failures:
    for name in ("gateway.log", "worker.log"):
        print("---- %s (tail)" % name)
        print("".join(open(os.path.join(tmp, name)).readlines()[-15:]))
sys.exit(1 if failures else 0)
