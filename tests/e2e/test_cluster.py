"""A cluster that loses nothing: two stateless gateways (started in an empty
folder, no model file) in front of two worker groups, behind a real load
balancer (haproxy, health-checking /health).

First a greedy stream whose group is killed mid-stream must go on on the
other group with the unbroken run's text. Then, under a streaming load:

  kill -9 one gateway, restart it; kill -9 one worker group, restart it
  (its streams resume on the other group: none may end with it);
  then SIGTERM the other gateway while streams run through it.

  test_cluster.py BUILD_DIR MODEL

Every request ends as ok (whole, [DONE]), error (an HTTP error, an error
event, or a cut the client sees at once) or hung (no byte for 20 s): hung
must be 0, the drained gateway's streams must finish whole, it must exit 0,
and every request started after the faults must succeed.
"""
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
BASE = 20000 + os.getpid() % 9000
EMPTY = tempfile.mkdtemp(prefix="llmserve-cluster-")
WA, WB, G1, G2, LB = BASE, BASE + 1, BASE + 2, BASE + 3, BASE + 4
procs = {}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    print(("ok  " if cond else "FAIL") + " " + what, flush=True)


def start(name, args):
    log = open(os.path.join(EMPTY, name + ".log"), "a")
    procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=EMPTY)
    return procs[name]


def worker(name, port):
    return start(name, [BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % port,
                        "--kv-cache-memory", "256MiB", "--max-model-len", "1024", "--threads", "1", "--log-level", "warn"])


def gateway(name, port):
    return start(name, [BUILD + "/llmserve-gateway", "--port", str(port), "--workers",
                        "tcp://127.0.0.1:%d,tcp://127.0.0.1:%d" % (WA, WB), "--shutdown-timeout", "20",
                        "--log-level", "info"])


def health(port, groups=1):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/health")
        r = c.getresponse()
        d = json.loads(r.read())
        return r.status == 200 and d["workers_up"] >= groups
    except (OSError, ValueError, http.client.HTTPException):
        return False


def wait(cond, secs=60):
    t = time.time()
    while time.time() - t < secs:
        if cond():
            return True
        time.sleep(0.1)
    return False


class Result:
    def __init__(self, t0):
        self.t0, self.t1, self.kind, self.gw, self.why, self.tokens = t0, None, None, None, None, 0


def one_request(port, max_tokens):
    """One streamed completion through the balancer; classified."""
    r = Result(time.time())
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                       "temperature": 0.8, "stream_options": {"include_usage": True}})
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            r.kind, r.why = "error", "HTTP %d" % resp.status
            resp.read()
            return r
        while True:
            line = resp.fp.readline()
            if not line:
                r.kind, r.why = "error", "cut without [DONE]"
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                r.kind = "ok" if r.kind is None else r.kind
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                r.kind, r.why = "error", ev["error"].get("code")
                continue
            r.gw = r.gw or ev["id"].split("-")[1]
            if ev.get("usage"):
                r.tokens = ev["usage"]["completion_tokens"]
        if r.kind == "ok" and r.tokens != max_tokens:
            r.kind, r.why = "error", "short: %d of %d" % (r.tokens, max_tokens)
    except socket.timeout:
        r.kind = "hung"
    except (OSError, http.client.HTTPException, ValueError) as e:
        r.kind, r.why = "error", type(e).__name__
    r.t1 = time.time()
    return r


def metric(port, name, label):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if (line.startswith(name + "{") and label in line) or (not label and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def resume_checks():
    """A greedy stream whose worker group is killed mid-stream goes on on the
    other group after the tokens the client has: the text is the unbroken run's."""
    body = {"prompt": "The history of the printing press", "max_tokens": 120, "temperature": 0, "ignore_eos": True}
    c = http.client.HTTPConnection("127.0.0.1", G1, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    ref = json.loads(c.getresponse().read())["choices"][0]["text"]
    body.update(stream=True, stream_options={"include_usage": True})
    c = http.client.HTTPConnection("127.0.0.1", G1, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    text, events, usage, errors, killed = "", 0, None, [], None
    while True:
        line = resp.fp.readline()
        if not line:
            errors.append("cut without [DONE]")
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        ev = json.loads(line[6:])
        if "error" in ev:
            errors.append(ev["error"].get("code"))
            continue
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("choices"):
            text += ev["choices"][0].get("text", "")
            events += 1
        if events == 15 and killed is None:  # mid-stream: kill the group it runs on
            on = [n for n, port in (("wa", WA), ("wb", WB))
                  if metric(G1, "llmserve:gateway_inflight", "127.0.0.1:%d" % port) == 1]
            killed = on[0] if len(on) == 1 else ""
            if killed:
                procs[killed].kill()
                procs[killed].wait()
    check(killed, "resume: the stream ran on one group (%s), killed after 15 events" % killed)
    check(not errors and text == ref and usage and usage["completion_tokens"] == 120,
          "resume: the stream went on on the other group: no error (%s), the text is the unbroken run's (%s), "
          "120 tokens (%s)" % (errors, text == ref, usage and usage["completion_tokens"]))
    if text != ref:
        print("   want %r\n   got  %r" % (ref, text))
    log = open(os.path.join(EMPTY, "g1.log")).read()
    n = metric(G1, "llmserve:resumed_total", "")
    check("resumed on group" in log and n == 1, "resume: logged, and llmserve:resumed_total is %s" % n)
    if killed:
        worker(killed, WA if killed == "wa" else WB)
    check(wait(lambda: health(G1, 2) and health(G2, 2)), "resume: the killed group restarted, both gateways use it")


def load(results, stop, seed):
    rnd = random.Random(seed)
    while not stop.is_set():
        results.append(one_request(LB, rnd.randint(16, 48)))


def gateway_id(name):
    """The gateway's id prefix as it appears in response ids (gw<pid hex>...)."""
    return "gw%x" % procs[name].pid


def main():
    if not shutil.which("haproxy"):
        print("haproxy not installed: cluster test skipped (apt-get install haproxy)")
        return 77
    worker("wa", WA)
    worker("wb", WB)
    gateway("g1", G1)
    gateway("g2", G2)
    cfg = os.path.join(EMPTY, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write("""global
    maxconn 512
defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    retries 2
    option redispatch
    # a draining gateway answers 503 before the health check notices: nothing
    # was started, so the balancer may send the request elsewhere
    option http-buffer-request
    retry-on conn-failure empty-response 503
frontend llm
    bind 127.0.0.1:%d
    default_backend gateways
backend gateways
    balance roundrobin
    # pooled upstream connections, as deployments run it: a connection a stream used serves the next request
    http-reuse always
    option httpchk GET /health
    http-check expect status 200
    server g1 127.0.0.1:%d check inter 250 fall 1 rise 1
    server g2 127.0.0.1:%d check inter 250 fall 1 rise 1
""" % (LB, G1, G2))
    start("haproxy", ["haproxy", "-db", "-f", cfg])
    try:
        check(wait(lambda: health(G1, 2) and health(G2, 2)), "two gateways from an empty folder see both groups")
        check(wait(lambda: health(LB, 2)), "haproxy answers through them")
        resume_checks()
        results, stop = [], threading.Event()
        clients = [threading.Thread(target=load, args=(results, stop, i)) for i in range(6)]
        for c in clients:
            c.start()
        time.sleep(3)
        marks = {}
        marks["kill g1"] = time.time()
        procs["g1"].kill()
        procs["g1"].wait()
        time.sleep(1.5)
        gateway("g1", G1)
        check(wait(lambda: health(G1, 2)), "g1 restarted and sees both groups")
        time.sleep(2)
        marks["kill wa"] = time.time()
        procs["wa"].kill()
        procs["wa"].wait()
        time.sleep(1.5)
        worker("wa", WA)
        check(wait(lambda: health(G1, 2) and health(G2, 2)), "group A restarted: both gateways use it again")
        time.sleep(2)
        g2 = gateway_id("g2")
        marks["sigterm g2"] = time.time()
        procs["g2"].send_signal(signal.SIGTERM)
        try:
            rc = procs["g2"].wait(30)
        except subprocess.TimeoutExpired:
            rc = "still running"
        marks["g2 exited"] = time.time()
        time.sleep(1)
        stop.set()
        for c in clients:
            c.join()
        kinds = {k: sum(1 for r in results if r.kind == k) for k in ("ok", "error", "hung")}
        print("cluster: %d requests: %d completed, %d failed with an error the client saw, %d hung; faults at %s" % (
            len(results), kinds["ok"], kinds["error"], kinds["hung"],
            ", ".join("%s +%.1fs" % (k, v - results[0].t0) for k, v in marks.items())))
        for r in results:
            if r.kind != "ok":
                print("   %s at +%.1fs via %s: %s" % (r.kind, r.t0 - results[0].t0, r.gw, r.why))
        check(kinds["hung"] == 0, "no request hung")
        check(kinds["ok"] >= len(results) * 0.8, "most requests completed across the faults")
        lost = [r for r in results if r.why in ("worker_lost", "aborted") or (r.why or "").startswith("short")]
        check(not lost, "no stream ended with its worker group: each went on on the other (%d lost)" % len(lost))
        drained = [r for r in results if r.gw and r.gw.startswith(g2) and r.t0 < marks["sigterm g2"] < r.t1]
        check(drained and all(r.kind == "ok" for r in drained),
              "the %d streams in flight through g2 when it got SIGTERM finished whole" % len(drained))
        check(rc == 0 and marks["g2 exited"] - marks["sigterm g2"] < 25, "g2 drained and exited 0 in %.1f s (%s)"
              % (marks["g2 exited"] - marks["sigterm g2"], rc))
        # after the faults: every request succeeds
        after = [one_request(LB, 16) for _ in range(12)]
        bad = [(r.kind, r.why) for r in after if r.kind != "ok"]
        check(not bad, "every request started after the faults succeeded (%d of 12): %s" % (12 - len(bad), bad))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for p in procs.values():
            p.wait()
    if failures:
        for name in sorted(os.listdir(EMPTY)):
            if name.endswith(".log"):
                print("---- %s (tail)" % name)
                print("".join(open(os.path.join(EMPTY, name)).readlines()[-12:]))
    print("cluster e2e: %d checks failed" % len(failures))
    return 1 if failures else 0


sys.exit(main())
