#!/usr/bin/env python3
"""A storm of hang-ups through the gateway, beside healthy streams.

  hangup_storm.py BUILD MODEL [--storm N] [--healthy H] [--json PATH]

A real worker and gateway on loopback. N streaming completions (default
300) start together with H healthy ones (default 8). Once every storm
stream has its first token, all N clients hang up at once. What must hold:
  - the worker stops computing for them at once: its running count falls
    to the healthy streams within two engine steps (read from the gateway's
    vllm:num_requests_running, which the worker's heartbeat refreshes each
    second, so the bound checked is two steps plus that second);
  - the gateway cancelled every one (llmserve:client_cancelled_total);
  - the worker never dropped the gateway (no missed heartbeats behind the
    cancels), so no healthy request was aborted;
  - every healthy stream finishes with all its tokens and [DONE].
It prints one line per check and the figures; exit 1 if any check fails.
The step time is the healthy streams' median gap between tokens while the
storm ran. Bounded: loopback only, every socket has a timeout."""
import argparse, http.client, json, os, re, socket, subprocess, sys, tempfile, threading, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: ports
from ports import free_port  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--storm", type=int, default=300)
ap.add_argument("--healthy", type=int, default=8)
ap.add_argument("--healthy-tokens", type=int, default=0, help="default 200: enough to outlast the storm")
ap.add_argument("--json", default="")
a = ap.parse_args()
a.build, a.model = os.path.abspath(a.build), os.path.abspath(a.model)
if not os.path.exists(a.model):
    print("hangup_storm: model %s not found: run tools/setup.sh" % a.model)
    sys.exit(77)


wport, gport = free_port(), free_port()
tmp = tempfile.mkdtemp(prefix="llmserve-storm-")
procs = []


def start(args, log):
    p = subprocess.Popen(args, stdout=open(os.path.join(tmp, log), "w"), stderr=subprocess.STDOUT, cwd=tmp)
    procs.append(p)
    return p


seqs = a.storm + a.healthy
start([a.build + "/llmserve-worker", "--model", a.model, "--listen", "tcp://127.0.0.1:%d" % wport,
       "--max-num-seqs", str(seqs), "--kv-cache-memory", "%dMiB" % max(256, seqs * 4), "--max-model-len", "1024",
       "--log-level", "warn"], "worker.log")
start([a.build + "/llmserve-gateway", "--port", str(gport), "--workers", "tcp://127.0.0.1:%d" % wport,
       "--max-connections", str(seqs + 64), "--no-log-requests"], "gateway.log")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    print(("ok  " if cond else "FAIL") + " " + what, flush=True)


def get(path):
    c = http.client.HTTPConnection("127.0.0.1", gport, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read()


def metric(name):
    _, d = get("/metrics")
    m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), d.decode(), re.M)
    return float(m.group(1)) if m else None


class Stream:
    """A streaming completion on a raw socket, so that it can hang up."""

    def __init__(self, body):
        self.s = socket.create_connection(("127.0.0.1", gport), timeout=120)
        b = json.dumps(dict(body, stream=True)).encode()
        self.s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(b), b))
        self.buf, self.events, self.times, self.done, self.err, self.usage = b"", 0, [], False, None, None

    def pump(self):
        """Reads what has come; False once the stream has ended."""
        try:
            d = self.s.recv(65536)
        except socket.timeout:
            self.err = "timeout"
            return False
        if not d:
            return False
        self.buf += d
        while b"\n\n" in self.buf:
            ev, self.buf = self.buf.split(b"\n\n", 1)
            i = ev.find(b"data: ")
            if i < 0:
                continue
            p = ev[i + 6:]
            if p == b"[DONE]":
                self.done = True
                return False
            j = json.loads(p)
            if "error" in j:
                self.err = j["error"].get("message")
                continue
            if j.get("usage"):
                self.usage = j["usage"]
            if j.get("choices"):
                self.events += 1
                self.times.append(time.time())
        return True

    def hang_up(self):
        try:
            self.s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.s.close()


def main():
    t = time.time()
    while time.time() - t < 60:
        try:
            if get("/health")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    else:
        check(False, "storm: the server came up")
        return
    cancelled0 = metric("llmserve:client_cancelled_total") or 0
    # the storm first, then the healthy streams, so that these outlast the storm's start
    storm = [Stream({"prompt": "Once upon a time %d" % i, "max_tokens": 900, "ignore_eos": True})
             for i in range(a.storm)]
    # wait for each storm stream's first token
    firsts, t0 = 0, time.time()
    pending = list(storm)
    while pending and time.time() - t0 < 300:
        s = pending.pop(0)
        s.s.settimeout(300 - (time.time() - t0))
        while s.events == 0 and s.pump():
            pass
        if s.events == 0:
            break
        firsts += 1
    first_s = time.time() - t0
    check(firsts == a.storm, "storm: %d of %d storm streams have their first token (%.1f s)" % (firsts, a.storm, first_s))
    # healthy streams now, in the full batch: their pace is the step time with the storm running. Each is
    # read on its own thread from here to its end.
    htok = a.healthy_tokens or 200
    healthy = [Stream({"prompt": "The healthy stream %d says" % i, "max_tokens": htok, "ignore_eos": True,
                       "stream_options": {"include_usage": True}}) for i in range(a.healthy)]

    def drain(s):
        s.s.settimeout(120)
        while s.pump():
            pass
    ths = [threading.Thread(target=drain, args=(s,)) for s in healthy]
    for th in ths:
        th.start()
    t1 = time.time()
    while time.time() - t1 < 60 and not all(s.events >= 12 or s.done or s.err for s in healthy):
        time.sleep(0.01)

    def pace(ts):  # seconds a token, over a stretch of them: one recv may bring several
        return (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else float("nan")
    paces = sorted(pace(list(s.times[2:12])) for s in healthy)
    step = paces[len(paces) // 2]
    running_before = metric("vllm:num_requests_running")
    print("storm: %d streams running (gateway's view), engine step %.0f ms with the storm (the healthy streams' "
          "median pace)" % (running_before or -1, step * 1e3), flush=True)
    # the storm: every storm client hangs up at once
    t_hang = time.time()
    for s in storm:
        s.hang_up()
    t_drained, running = None, None
    while time.time() - t_hang < 30:
        running = metric("vllm:num_requests_running")
        if running is not None and running <= a.healthy:
            t_drained = time.time()
            break
        time.sleep(0.05)
    for th in ths:
        th.join(180)
    drain_s = (t_drained - t_hang) if t_drained else float("inf")
    # the heartbeat that carries the count comes once a second
    check(t_drained is not None and drain_s <= 2 * step + 1.5,
          "storm: running fell from %s to %s within %.2f s of the hang-ups (bound: two steps of %.0f ms + the 1 s "
          "heartbeat)" % (running_before, running, drain_s, step * 1e3))
    t = time.time()
    cancelled = 0
    while time.time() - t < 10:
        cancelled = (metric("llmserve:client_cancelled_total") or 0) - cancelled0
        if cancelled >= a.storm:
            break
        time.sleep(0.2)
    check(cancelled >= a.storm, "storm: the gateway cancelled %d of the %d hung-up streams" % (cancelled, a.storm))
    dropped = metric("llmserve:worker_gateways_dropped_total") or 0
    aborted = metric("llmserve:worker_requests_aborted_on_drop_total") or 0
    check(dropped == 0 and aborted == 0, "storm: the worker never dropped the gateway (dropped %d, requests aborted "
          "%d)" % (dropped, aborted))
    ok = [s for s in healthy if s.done and not s.err and s.usage and s.usage.get("completion_tokens") == htok]
    check(len(ok) == a.healthy, "storm: %d of %d healthy streams finished with all %d tokens and [DONE]%s" %
          (len(ok), a.healthy, htok, "" if len(ok) == a.healthy else
           " (%s)" % [(s.done, s.err, s.usage) for s in healthy if s not in ok][:3]))
    after = sorted(pace([x for x in s.times if x >= t_hang + drain_s + 0.5][:40]) for s in healthy)
    step_after = after[len(after) // 2] if after else float("nan")
    print("storm: engine step %.0f ms after the storm (was %.0f ms with it)" % (step_after * 1e3, step * 1e3))
    st, _ = get("/health")
    check(st == 200, "storm: the server is healthy afterwards")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"storm": a.storm, "healthy": a.healthy, "first_tokens_s": first_s, "step_ms": step * 1e3,
                       "step_after_ms": step_after * 1e3, "drain_s": drain_s, "cancelled": cancelled,
                       "dropped": dropped, "aborted": aborted, "healthy_ok": len(ok)}, f, indent=1)


try:
    main()
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    if failures:
        for n in ("worker.log", "gateway.log"):
            print("---- %s (tail)" % n)
            print("".join(open(os.path.join(tmp, n)).readlines()[-15:]))
print("hangup_storm: %d checks failed" % len(failures))
sys.exit(1 if failures else 0)
