"""Faults, drains and hostile clients against real processes on loopback.

  test_faults.py BUILD_DIR MODEL

Every gateway here starts in an empty folder with no --model: it serves what
its workers' handshake hands it. Checks (each prints its figures):
  serve     `llmserve serve`: kill -9 of the worker mid-stream -> an error event
            within 5 s, the next request succeeds; SIGTERM mid-stream -> /health
            503, new requests 503, the stream finishes whole, exit 0.
  http      header checks (two Content-Length, +N, no Host), 405 with Allow,
            HEAD /health, validation against the vocabulary before any 200.
  hostile   the largest allowed body of adversarial text: /health and a
            concurrent stream keep answering; its own answer is a clear 400.
  hangups   streaming clients that hang up leak nothing and are cancelled on
            the worker; non-streaming ones too (they free their queue slot).
  groups    a group serving another tokenizer under the same name is refused;
            a dead group's gauges read zero; restarts are seen as incarnations.
  auth      an API keys file with no key refuses to start; logs carry no key.
  tpdeadline an idle TP group outlives its collective deadline; a stalled load
            and a rank that never joins end in time, naming their flags.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
BASE = 10000 + os.getpid() % 9000  # below the kernel's ephemeral range (32768+), clear of test_cluster's 20000+
EMPTY = tempfile.mkdtemp(prefix="llmserve-faults-")  # the gateways' cwd: no models/ in reach
failures = []
procs = []


def check(cond, what):
    if not cond:
        failures.append(what)
    print(("ok  " if cond else "FAIL") + " " + what, flush=True)


def start(args, log, cwd=EMPTY, env=None):
    f = open(os.path.join(EMPTY, log), "w")
    p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    procs.append(p)
    return p


def worker(port, *extra):
    return start([BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % port,
                  "--kv-cache-memory", "256MiB", "--max-model-len", "2048", "--threads", "1", "--log-level", "warn"]
                 + list(extra), "worker-%d.log" % port)


def gateway(port, workers, *extra, log=None):
    return start([BUILD + "/llmserve-gateway", "--port", str(port), "--workers", ",".join(
        "tcp://127.0.0.1:%d" % w for w in workers)] + list(extra), log or "gateway-%d.log" % port)


def get(port, path, method="GET", timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path)
    r = c.getresponse()
    d = r.read()
    c.close()
    return r.status, dict(r.getheaders()), d


def post(port, path, body, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, body=body if isinstance(body, bytes) else json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    d = r.read()
    c.close()
    return r.status, d


def wait_up(port, groups=1, secs=60):
    t = time.time()
    while time.time() - t < secs:
        try:
            st, _, d = get(port, "/health", timeout=2)
            if st == 200 and json.loads(d)["workers_up"] >= groups:
                return True
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.1)
    return False


def metric(port, name, labels=None):
    _, _, d = get(port, "/metrics")
    total = None
    for line in d.decode().splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) == name and (labels is None or labels in (m.group(2) or "")):
            total = (total or 0) + float(m.group(3))
    return total


class Stream:
    """A streamed completion read event by event; kind ends as ok | error | hung."""

    def __init__(self, port, body, timeout=30):
        self.events, self.kind, self.first, self.end, self.status, self.done = [], None, None, None, None, False
        self.error = None
        body = dict(body, stream=True)
        self.t0 = time.time()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            self.conn, self.resp = c, c.getresponse()
            self.status = self.resp.status
            if self.status != 200:
                self.error = self.resp.read()
                self.kind = "error"
        except socket.timeout:
            self.kind = "hung"
        except (OSError, http.client.HTTPException) as e:
            self.kind, self.error = "error", repr(e)

    def read(self, until=None):
        """Reads events; until(event) True stops early (the stream stays open)."""
        if self.kind:
            return self
        try:
            while True:
                line = self.resp.fp.readline()
                if not line:
                    self.kind = self.kind or "error"  # cut without [DONE]
                    self.error = self.error or "connection closed without [DONE]"
                    break
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if self.first is None:
                    self.first = time.time()
                if data == b"[DONE]":
                    self.end, self.done = time.time(), True
                    self.kind = self.kind or "ok"
                    break
                ev = json.loads(data)
                if "error" in ev:
                    self.kind, self.error, self.end = "error", ev["error"], time.time()
                self.events.append(ev)
                if until and until(ev):
                    return self
        except socket.timeout:
            self.kind = "hung"
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.kind, self.error = "error", repr(e)
        return self

    def text(self):
        return "".join(c.get("text", "") for e in self.events for c in e.get("choices", []))

    def finish(self):
        for e in self.events:
            for c in e.get("choices", []):
                if c.get("finish_reason"):
                    return c["finish_reason"]
        return None

    def close(self):
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        try:
            self.conn.close()
        except OSError:
            pass


def children(pid, name):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        if ppid == pid and comm.startswith(name):
            out.append(int(d))
    return out


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


LONG = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "temperature": 0}


# ---- serve: kill -9 of the worker, then SIGTERM ------------------------------
def serve_checks():
    port = BASE + 1
    sv = start([BUILD + "/llmserve", "serve", MODEL, "--port", str(port), "--max-model-len", "2048",
                "--kv-cache-memory", "256MiB", "--log-level", "warn", "--shutdown-timeout", "20"], "serve.log")
    check(wait_up(port), "serve: up")
    s = Stream(port, LONG).read(until=lambda e: len(e.get("choices", [])) and e["choices"][0].get("text"))
    w = children(sv.pid, "llmserve-worke")
    check(len(w) == 1, "serve: one worker child")
    t = time.time()
    os.kill(w[0], signal.SIGKILL)
    s.read()
    dt = (s.end or time.time()) - t
    check(s.kind == "error" and dt <= 5.0, "serve: kill -9 of the worker mid-stream ends the stream with an error "
          "event in %.2f s (<= 5): %s" % (dt, s.error))
    check(wait_up(port), "serve: the worker is back")
    st, d = post(port, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    check(st == 200 and json.loads(d)["choices"][0]["text"].startswith(" Paris"), "serve: the next request succeeds")
    # SIGTERM while a stream runs: it finishes whole; new work is refused at once
    s = Stream(port, dict(LONG, max_tokens=120)).read(until=lambda e: True)
    sv.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        hs, _, _ = get(port, "/health", timeout=3)
        ns, _ = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=5)
    except OSError as e:
        hs = ns = repr(e)
    check(hs == 503 and ns == 503, "serve: draining: /health %s, new request %s (503 both)" % (hs, ns))
    s.read()
    n = sum(len(e["choices"]) and 1 for e in s.events if e.get("choices"))
    check(s.kind == "ok" and s.finish() == "length", "serve: the in-flight stream finished whole (%s, %d events, %s)"
          % (s.kind, n, s.finish()))
    try:
        rc = sv.wait(30)
    except subprocess.TimeoutExpired:
        rc = "still running"
    check(rc == 0, "serve: exits 0 after the drain (%s)" % rc)


# ---- HTTP edge cases --------------------------------------------------------
def raw_http(port, data, timeout=5):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
            if b"\r\n\r\n" in out and (b"Content-Length: 0" in out or out.rstrip().endswith(b"}")):
                break
    except socket.timeout:
        pass
    s.close()
    return out


def http_checks(port):
    r = raw_http(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n"
                       b"{\"a\":1}")
    check(r.startswith(b"HTTP/1.1 400 Bad Request") and b"Content-Length" in r, "http: two Content-Length -> 400")
    r = raw_http(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +7\r\n\r\n{\"a\":1}")
    check(r.startswith(b"HTTP/1.1 400"), "http: Content-Length +N -> 400")
    r = raw_http(port, b"GET /health HTTP/1.1\r\n\r\n")
    check(r.startswith(b"HTTP/1.1 400") and b"Host" in r, "http: HTTP/1.1 without Host -> 400")
    r = raw_http(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n")
    check(r.startswith(b"HTTP/1.1 400"), "http: a NUL byte in a header -> 400")
    # what evhttp refuses itself goes out as JSON in HTTP/1.1, not as its HTML page in the client's version
    for req, want, what in ((b"GET /health HTTP/1.5\r\nHost: x\r\n\r\n", b"HTTP/1.1 505", "HTTP/1.5 -> 505"),
                            (b"GET /health HTTP/1.-1\r\nHost: x\r\n\r\n", b"HTTP/1.1 ", "HTTP/1.-1 -> an error"),
                            (b"GARBAGE\r\n\r\n", b"HTTP/1.1 400", "a request line without a version -> 400"),
                            (b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", b"HTTP/1.1 400",
                             "a header line without a colon -> 400")):
        r = raw_http(port, req)
        body = r.split(b"\r\n\r\n", 1)[-1]
        try:
            err = json.loads(body).get("error", {})
        except ValueError:
            err = {}
        check(r.startswith(want) and not r.startswith(b"HTTP/1.1 200") and err.get("message"),
              "http: %s, a JSON error (%r)" % (what, r[:40]))
    st, h, d = get(port, "/health", "DELETE")
    check(st == 405 and h.get("Allow") == "GET, HEAD" and json.loads(d)["error"]["code"] == "method_not_allowed",
          "http: DELETE /health -> 405 with Allow and a JSON error")
    st, h, d = get(port, "/health", "HEAD")
    check(st == 200 and d == b"", "http: HEAD /health -> 200, no body")
    st, h, d = get(port, "/v1/completions", "GET")
    check(st == 405 and h.get("Allow") == "POST", "http: GET on a POST endpoint -> 405 Allow: POST")
    # what the worker would refuse mid-stream is refused before the 200
    for body, param in (({"prompt": "x", "logit_bias": {"9999999": 1}}, "logit_bias"),
                        ({"prompt": "x", "stop_token_ids": [9999999]}, "stop_token_ids"),
                        ({"prompt": "x", "max_tokens": 2, "min_tokens": 5}, "min_tokens"),
                        ({"prompt": [1, 2, 9999999]}, "prompt"),
                        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
                        ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}},
                         "response_format"),
                        ({"prompt": "x", "guided_grammar": "root ::= undefined"}, "guided_grammar")):
        s = Stream(port, body) if "stream_options" not in body else None
        if s is None:
            st, d = post(port, "/v1/completions", body)
        else:
            st, d = s.status, s.error
        ok = st == 400 and json.loads(d)["error"]["param"] == param
        check(ok, "http: %s refused with 400 naming it, before any stream starts (%s)" % (param, st))
    st, d = post(port, "/v1/completions", {"prompt": "a\u0000b", "max_tokens": 2})
    check(st == 200, "http: \\u0000 in a prompt is valid JSON and accepted")


# ---- hostile body -------------------------------------------------------------
def hostile_checks(port, max_body):
    lat, gaps, stop = [], [], threading.Event()

    def poll():
        while not stop.is_set():
            t = time.time()
            try:
                get(port, "/health", timeout=5)
                lat.append(time.time() - t)
            except OSError:
                lat.append(5.0)
            time.sleep(0.005)

    # a concurrent stream: its event gaps, against the same stream run alone
    def stream_gaps(out):
        s = Stream(port, dict(LONG, max_tokens=150))
        last = None
        while True:
            s.read(until=lambda e: True)
            now = time.time()
            if last is not None and s.kind is None:
                out.append(now - last)
            last = now
            if s.kind:
                break
        return s

    alone = []
    stream_gaps(alone)
    th = threading.Thread(target=poll)
    th.start()
    during = []
    sg = threading.Thread(target=stream_gaps, args=(during,))
    sg.start()
    time.sleep(0.3)
    unit = "Hello" * 3 + "!?" + "<|im_start|>" + "\u0416\u4e2d" + "1234567890" + " " * 7
    reps = (max_body - 64) // len(unit.encode())
    body = json.dumps({"prompt": unit * reps, "max_tokens": 4}, ensure_ascii=False).encode()
    check(max_body - 1024 < len(body) <= max_body, "hostile: the body is %d bytes, the most allowed is %d" % (len(body), max_body))
    t = time.time()
    st, d = post(port, "/v1/completions", body, timeout=60)
    own = time.time() - t
    sg.join()
    time.sleep(0.2)
    stop.set()
    th.join()
    # a chunked body over the limit: evhttp finds it; the 413 is JSON like the Content-Length one
    chunk = b"x" * 65536
    cs = socket.create_connection(("127.0.0.1", port), timeout=20)
    up = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + \
        (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * (max_body // len(chunk) + 2) + b"0\r\n\r\n"

    def upload():
        try:
            cs.sendall(up)
        except OSError:
            pass  # the gateway stopped reading once it had answered
    ut = threading.Thread(target=upload)
    ut.start()
    r = b""
    try:
        while not (b"\r\n\r\n" in r and r.rstrip().endswith(b"}")):
            b_ = cs.recv(65536)
            if not b_:
                break
            r += b_
    except OSError:
        pass
    cs.close()
    ut.join()
    rb = r.split(b"\r\n\r\n", 1)[-1]
    check(r.startswith(b"HTTP/1.1 413") and b"request_too_large" in rb,
          "hostile: a chunked body over --max-body-bytes -> 413 as JSON (%r)" % r[:60])
    err = json.loads(d).get("error", {}) if st != 200 else {}
    check(st == 400 and err.get("code") == "context_length_exceeded",
          "hostile: %.1f MiB of adversarial text answered 400 %s in %.2f s" % (len(body) / 2**20, err.get("code"), own))
    lat.sort()
    p50, p95, mx = lat[len(lat) // 2] * 1e3, lat[(len(lat) * 95) // 100] * 1e3, lat[-1] * 1e3
    ga, gd = max(alone) * 1e3, max(during) * 1e3
    print("hostile: /health over %d polls: median %.1f ms, p95 %.1f ms, max %.1f ms; stream's longest gap %.1f ms "
          "alone, %.1f ms during" % (len(lat), p50, p95, mx, ga, gd))
    # the stall this guards against was tens of seconds. The bound (50 ms) holds for p95; on a shared
    # 2-core machine, or under ASan, one poll in a hundred can lose its core for a few tens of ms more, so the
    # worst poll is only held to a bound that a blocked loop would break.
    check(p95 <= 50 and mx <= 1000, "hostile: /health kept answering (p95 %.1f ms <= 50, max %.1f ms <= 1000)"
          % (p95, mx))
    # the stream shares two cores with the upload and the JSON parse: a stall would be seconds, not tens of ms
    print("hostile: a concurrent stream's longest gap grew by %.1f ms (CPU shared with the upload and parse)" % (gd - ga))
    check(gd - ga <= 2000, "hostile: a concurrent stream kept flowing (gap growth %.1f ms; a stall would be seconds)" % (gd - ga))


# ---- hang-ups -----------------------------------------------------------------
def hangup_checks(port, small_port, gw_pid):
    pad = "x" * (4 << 20)

    def hang_up(n):
        for i in range(n):
            s = Stream(port, dict(LONG, max_tokens=400, padding=pad))
            s.read(until=lambda e: True)
            s.close()
        time.sleep(1.0)

    hang_up(8)  # the allocator's high-water mark settles first
    base = rss(gw_pid)
    hang_up(24)
    grown = rss(gw_pid) - base
    check(grown < 16 << 20, "hangups: 24 more streams with 4 MiB bodies hung up mid-stream: gateway RSS grew %.1f MiB "
          "(a leak of the bodies would be 96)" % (grown / 2**20))
    running = None
    for _ in range(30):
        running = metric(port, "vllm:num_requests_running")
        if running == 0:
            break
        time.sleep(0.2)
    check(running == 0, "hangups: the worker stopped computing for them (running %s)" % running)
    # non-streaming clients that hang up free their --max-queue 2 slots
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", small_port))
        b = json.dumps(dict(LONG, max_tokens=1500)).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d"
                  b"\r\n\r\n%s" % (len(b), b))
        time.sleep(0.2)
        s.close()
    time.sleep(1.0)
    st, d = post(small_port, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    cancelled = metric(small_port, "llmserve:client_cancelled_total")
    check(st == 200 and cancelled >= 2, "hangups: two abandoned non-streamed requests were cancelled (%s) and "
          "freed their slots (next: %s)" % (cancelled, st))


# ---- groups: tokenizer mismatch, dead group gauges, incarnations ------------------
def group_checks():
    wp, dp, gp = BASE + 20, BASE + 21, BASE + 22
    w = worker(wp)
    name = os.path.basename(MODEL)[:-5] if MODEL.endswith(".gguf") else os.path.basename(MODEL)
    d = start([BUILD + "/llmserve-worker", "--load-format", "dummy", "--model-config", "smollm2-135m", "--listen",
               "tcp://127.0.0.1:%d" % dp, "--kv-cache-memory", "64MiB", "--max-model-len", "512", "--threads", "1",
               "--served-model-name", name, "--log-level", "warn"], "dummy.log")
    g = gateway(gp, [wp, dp], log="groups-gw.log")
    check(wait_up(gp, 1), "groups: gateway up")
    t = time.time()  # the dummy group loads and warms up (seconds under the sanitizers), then is refused
    while time.time() - t < 60 and "is not used" not in open(os.path.join(EMPTY, "groups-gw.log")).read():
        time.sleep(0.2)
    time.sleep(1.5)
    log = open(os.path.join(EMPTY, "groups-gw.log")).read()
    up = [metric(gp, "llmserve:worker_up", "127.0.0.1:%d" % p) for p in (wp, dp)]
    check("is not used" in log and "tokenizer" in log and up == [1, 0],
          "groups: a group with another tokenizer under the same name is refused (worker_up %s)" % up)
    for _ in range(4):
        st, _ = post(gp, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        if st != 200:
            break
    check(st == 200, "groups: requests go to the matching group")
    # a dead group reads zero, not its last numbers
    s = Stream(gp, LONG).read(until=lambda e: True)
    t = time.time()
    w.send_signal(signal.SIGKILL)
    s.read()
    check(s.kind == "error" and time.time() - t <= 5, "groups: its stream ended with an error %.1f s after the kill"
          % (time.time() - t))
    time.sleep(3.5)
    vals = [metric(gp, n, "127.0.0.1:%d" % wp) for n in ("llmserve:worker_up", "llmserve:num_requests_running",
                                                             "llmserve:kv_cache_usage_perc")]
    check(vals == [0, 0, 0], "groups: a dead group's gauges read zero: %s" % vals)
    st, _, hd = get(gp, "/health")
    check(st == 503, "groups: /health 503 with no usable group (%s)" % hd)
    w2 = worker(wp)
    check(wait_up(gp, 1), "groups: the restarted group (a new incarnation) is used again")
    for p in (w2, d, g):
        p.terminate()


# ---- partitions, drain deadlines, descriptors, slow headers -----------------------
def more_checks():
    wp, gp, tp = BASE + 40, BASE + 41, BASE + 42
    w = worker(wp)
    g = gateway(gp, [wp], "--header-timeout", "2", log="more-gw.log")
    check(wait_up(gp), "more: up")
    # a group that stops answering (SIGSTOP) is declared dead, and its requests
    # are cancelled there too: when it wakes it does not go on computing them
    s = Stream(gp, dict(LONG, max_tokens=1500)).read(until=lambda e: True)
    w.send_signal(signal.SIGSTOP)
    t = time.time()
    s.read()
    dt = time.time() - t
    time.sleep(max(0.0, 4.3 - dt))
    w.send_signal(signal.SIGCONT)
    check(s.kind == "error" and s.done and dt <= 4.5, "more: a frozen group's stream ended with an error event and "
          "[DONE] after %.1f s (%s, done %s, %s)" % (dt, s.kind, s.done, s.error))
    wait_up(gp)
    running = None
    for _ in range(20):
        running = metric(gp, "llmserve:num_requests_running", "127.0.0.1:%d" % wp)
        if running == 0:
            break
        time.sleep(0.2)
    check(running == 0, "more: once it woke, the group had cancelled the request (running %s)" % running)
    # one byte every 0.4 s: the header deadline (2 s) closes it, however busy it looks
    sl = socket.create_connection(("127.0.0.1", gp))
    t, closed = time.time(), False
    try:
        for ch in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:
            sl.send(bytes([ch]))
            time.sleep(0.4)
            if time.time() - t > 8:
                break
    except OSError:
        closed = True
    sl.settimeout(1)
    try:
        closed = closed or sl.recv(10) == b""
    except (socket.timeout, OSError):
        pass
    sl.close()
    check(closed and time.time() - t < 6, "more: a header sent a byte at a time was cut at its deadline (%.1f s)"
          % (time.time() - t))
    # past --shutdown-timeout the rest end with an error event and [DONE], never a cut body
    d = gateway(tp, [wp], "--shutdown-timeout", "1", log="drain-gw.log")
    check(wait_up(tp), "more: drain gateway up")
    s = Stream(tp, dict(LONG, max_tokens=1500)).read(until=lambda e: True)
    d.send_signal(signal.SIGTERM)
    s.read()
    try:
        rc = d.wait(10)
    except subprocess.TimeoutExpired:
        rc = None
    code = s.error.get("code") if isinstance(s.error, dict) else s.error
    check(s.kind == "error" and s.done and code == "shutting_down" and rc == 0,
          "more: past the drain deadline a stream ends with an error event (%s) and [DONE]; exit %s" % (code, rc))
    g.terminate()
    w.terminate()


def fd_checks():
    import resource
    wp, gp = BASE + 50, BASE + 51
    w = worker(wp)

    def low_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    f = open(os.path.join(EMPTY, "fd-gw.log"), "w")
    g = subprocess.Popen([BUILD + "/llmserve-gateway", "--port", str(gp), "--workers", "tcp://127.0.0.1:%d" % wp,
                          "--max-connections", "1000", "--log-level", "info"], stdout=f, stderr=subprocess.STDOUT,
                         cwd=EMPTY, preexec_fn=low_fds)
    procs.append(g)
    check(wait_up(gp), "fds: gateway with 64 file descriptors up")

    def cpu():
        with open("/proc/%d/stat" % g.pid) as fh:
            v = fh.read().rsplit(")", 1)[1].split()
        return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")

    socks = []
    for _ in range(120):
        try:
            socks.append(socket.create_connection(("127.0.0.1", gp), timeout=1))
        except OSError:
            break
    c0 = cpu()
    time.sleep(2)
    burned = cpu() - c0
    for s in socks:
        s.close()
    time.sleep(0.5)
    ok = wait_up(gp, secs=10)
    lines = sum(1 for line in open(os.path.join(EMPTY, "fd-gw.log")) if "accept failed" in line)
    check(burned < 0.5 and lines <= 3 and ok, "fds: out of descriptors with %d clients waiting, the gateway used %.2f s "
          "of CPU in 2 s, logged %d accept failures, and serves again once they left" % (len(socks), burned, lines))
    g.terminate()
    w.terminate()


# ---- auth -------------------------------------------------------------------------
def auth_checks():
    empty = os.path.join(EMPTY, "keys-empty")
    with open(empty, "w") as f:
        f.write("# no keys yet\n\n")
    p = subprocess.run([BUILD + "/llmserve-gateway", "--port", str(BASE + 30), "--api-keys-file", empty],
                       capture_output=True, timeout=10, cwd=EMPTY)
    check(p.returncode == 2 and b"no API key" in p.stderr, "auth: an API keys file with no key refuses to start (%d)"
          % p.returncode)
    keys = os.path.join(EMPTY, "keys")
    secret = "sk-" + "z" * 300
    with open(keys, "w") as f:
        f.write("  %s  \n" % secret)
    gp = BASE + 31
    g = gateway(gp, [BASE + 10], "--api-keys-file", keys, log="auth-gw.log")
    check(wait_up(gp), "auth: gateway with a keys file up")
    c = http.client.HTTPConnection("127.0.0.1", gp, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hi", "max_tokens": 2}),
              headers={"Authorization": "Bearer " + secret})
    st = c.getresponse().status
    c.close()
    st2, _ = post(gp, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    time.sleep(0.3)
    log = open(os.path.join(EMPTY, "auth-gw.log")).read()
    check(st == 200 and st2 == 401, "auth: a 300-byte key with trailing spaces in the file works; none -> 401")
    check(secret not in log and "401" in log and "key=#" in log, "auth: the log names 401s and a key's tag, never the key")
    g.terminate()


# ---- deadlines --------------------------------------------------------------
def deadline_checks():
    """A prompt the worker cannot compute before the request's first-token
    deadline is refused at once (504, saying why), not timed out later."""
    wp, gp = BASE + 70, BASE + 71
    w = worker(wp)
    g = gateway(gp, [wp], "--ttft-timeout", "1", log="deadline-gw.log")
    check(wait_up(gp), "deadline: up")
    st, _ = post(gp, "/v1/completions", {"prompt": "warm up " * 200, "max_tokens": 2})  # the worker times its steps
    words = " ".join("word%d" % i for i in range(480))  # about 1,800 tokens: seconds of prefill on a CPU
    t = time.time()
    st, d = post(gp, "/v1/completions", {"prompt": words, "max_tokens": 2})
    dt = time.time() - t
    err = json.loads(d).get("error", {}) if st != 200 else {}
    check(st == 504 and err.get("code") == "timeout" and "deadline" in err.get("message", "") and dt < 0.9,
          "deadline: a prompt that cannot finish its prefill within --ttft-timeout 1 is refused in %.3f s: %d %s"
          % (dt, st, err.get("message")))
    st, d = post(gp, "/v1/completions", {"prompt": "a short one", "max_tokens": 2})
    check(st == 200, "deadline: a short prompt still runs (%d)" % st)
    g.terminate()
    w.terminate()


# ---- probes -------------------------------------------------------------------
def probe_checks():
    """--health-port: the worker's /live answers from the start, /ready only
    once the model is loaded and warmed and not while it drains; the
    gateway's /live answers with no worker at all, its /ready does not."""
    wp, hp, gp = BASE + 90, BASE + 91, BASE + 92

    def probe(port, path):
        try:
            return get(port, path, timeout=2)[0]
        except OSError:
            return None
    g = gateway(gp, [wp], log="probe-gw.log")
    for _ in range(50):
        if probe(gp, "/live") == 200:
            break
        time.sleep(0.1)
    check(probe(gp, "/live") == 200 and probe(gp, "/ready") == 503,
          "probes: a gateway without workers is live (200) and not ready (503)")
    w = worker(wp, "--health-port", str(hp))
    seen, t = [], time.time()
    while time.time() - t < 60:
        r, l = probe(hp, "/ready"), probe(hp, "/live")
        if r is not None and (not seen or seen[-1] != (r, l)):
            seen.append((r, l))
        if r == 200:
            break
        time.sleep(0.02)
    check(seen and seen[-1] == (200, 200) and all(l == 200 for _, l in seen),
          "probes: the worker is live throughout and ready once loaded and warmed (%s)" % seen)
    check(wait_up(gp) and probe(gp, "/ready") == 200, "probes: the gateway is ready once the worker is")
    s = Stream(gp, dict(LONG, max_tokens=300))
    s.read(until=lambda e: True)
    w.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    check(probe(hp, "/ready") == 503 and probe(hp, "/live") == 200,
          "probes: draining, the worker is live but not ready")
    s.close()
    g.terminate()


# ---- a group over two "hosts" --------------------------------------------------
def node_checks():
    """--ranks-per-node / --node-index, as a LeaderWorkerSet starts a group:
    two processes, each the first rank of its host, each starting its host's
    other rank; all four join rank 0 over TCP. (Both "hosts" are this one, so
    the shared-memory backend works; across real hosts it is NCCL's.)"""
    lp, cp, gp = BASE + 95, BASE + 96, BASE + 97
    # the default model has 3 KV heads: four ranks need a shape with 4 (dummy weights of a small llama)
    cfg = os.path.join(EMPTY, "tp4-config.json")
    with open(cfg, "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 2048,
                   "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}, f)
    tp_args = ["--tensor-parallel-size", "4", "--ranks-per-node", "2", "--group-address", "tcp://127.0.0.1:%d" % cp,
               "--load-format", "dummy", "--model-config", cfg, "--threads", "1", "--kv-cache-memory", "64MiB",
               "--max-model-len", "1024"]
    lead = start([BUILD + "/llmserve-worker", "--listen", "tcp://127.0.0.1:%d" % lp, "--node-index", "0"] + tp_args,
                 "node0.log")
    other = start([BUILD + "/llmserve-worker", "--node-index", "1"] + tp_args, "node1.log")
    g = gateway(gp, [lp], log="nodes-gw.log")
    check(wait_up(gp, secs=90), "nodes: a TP=4 group from two processes of two ranks each is up")
    kids = children(lead.pid, "exe") + children(other.pid, "exe")  # ranks re-run /proc/self/exe
    check(len(kids) == 2, "nodes: each host's first rank started one more (%d children)" % len(kids))
    st, d = post(gp, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0,
                                         "ignore_eos": True})
    n = json.loads(d)["usage"]["completion_tokens"] if st == 200 else 0
    check(st == 200 and n == 8, "nodes: the group answers (%d, %d tokens)" % (st, n))
    other.kill()  # a host goes away: rank 0 notices at its next collective and the group ends whole
    post(gp, "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=30)
    try:
        lead.wait(30)
        gone = True
    except subprocess.TimeoutExpired:
        gone = False
    check(gone, "nodes: losing a host ends the group (rank 0 exited %s)" % lead.returncode)
    g.terminate()


# ---- shared secret ------------------------------------------------------------
def secret_checks():
    """--rpc-secret-file: a gateway without the worker group's secret cannot
    use it, nor a worker without the gateway's; with it, all works."""
    sec, loose = os.path.join(EMPTY, "rpc.secret"), os.path.join(EMPTY, "loose.secret")
    for path, mode in ((sec, 0o600), (loose, 0o644)):
        with open(path, "w") as f:
            f.write("  correct-horse-battery-staple-42\n")
        os.chmod(path, mode)
    r = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--rpc-secret-file", loose], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 2 and "readable by others" in r.stderr, "secret: a secret file others can read is refused (%d %s)"
          % (r.returncode, r.stderr.strip()[:90]))
    wp, gp, sp, tp, up = BASE + 80, BASE + 81, BASE + 82, BASE + 83, BASE + 84
    worker(wp, "--rpc-secret-file", sec)
    gateway(gp, [wp], "--rpc-secret-file", sec, log="secret-ok-gw.log")
    gateway(sp, [wp], log="secret-none-gw.log")
    check(wait_up(gp), "secret: a gateway with the group's secret is up")
    st, d = post(gp, "/v1/completions", {"prompt": "Hello", "max_tokens": 3})
    check(st == 200, "secret: and serves (%d)" % st)
    check(not wait_up(sp, secs=4), "secret: a gateway without it never sees the group")
    log = open(os.path.join(EMPTY, "worker-%d.log" % wp)).read()
    check("without the shared secret" in log, "secret: the worker logs what it refused")
    # the other way: a gateway with the secret does not take a worker without it
    worker(tp)
    gateway(up, [tp], "--rpc-secret-file", sec, log="secret-gw-only.log")
    check(not wait_up(up, secs=4), "secret: a worker without the secret is not used")
    glog = open(os.path.join(EMPTY, "secret-gw-only.log")).read()
    check("without the shared secret" in glog and glog.count("message from a worker dropped") <= 2,
          "secret: the gateway logs it, once per 10 s")
    # a tensor-parallel group's control channel: a rank without the secret is refused, one with it joins
    r0, cp, g2 = BASE + 85, BASE + 86, BASE + 87
    ctl = "tcp://127.0.0.1:%d" % cp
    tp_args = ["--tensor-parallel-size", "2", "--group-address", ctl]
    w0 = worker(r0, "--rank", "0", "--rpc-secret-file", sec, *tp_args)
    time.sleep(0.5)
    r = None
    for _ in range(20):  # until rank 0 listens
        r = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--rank", "1", "--threads", "1"] + tp_args,
                           capture_output=True, text=True, timeout=120)
        if "refused" in r.stderr:
            break
        time.sleep(0.5)
    check(r.returncode != 0 and "lacks the group's secret" in r.stderr,
          "secret: a TP rank without the secret is refused by rank 0 (%s)" % r.stderr.strip()[-100:])
    worker(BASE + 88, "--rank", "1", "--rpc-secret-file", sec, *tp_args)
    gateway(g2, [r0], "--rpc-secret-file", sec, log="secret-tp-gw.log")
    check(wait_up(g2, secs=90), "secret: with the secret the rank joins and the TP group serves")
    st, d = post(g2, "/v1/completions", {"prompt": "Hello", "max_tokens": 3})
    check(st == 200, "secret: the TP group answers (%d)" % st)
    w0.terminate()


# ---- deadlines a cluster needs: an idle TP group, a load that never ends ------------
def deadline_group_checks():
    """--collective-timeout: a rank that waits past it for a step is taken as
    hung, so an idle group's rank 0 keeps its ranks within it; a group idle
    for four and a half deadlines still answers. --load-timeout: a load that
    stalls (a rank stopped once the group formed) ends the worker with exit 1
    and a line naming the flag. --join-timeout:
    a rank that never joins ends rank 0 with a line naming the flag."""
    wp, gp, hp = BASE + 100, BASE + 101, BASE + 102
    w = worker(wp, "--tensor-parallel-size", "2", "--collective-timeout", "2")
    g = gateway(gp, [wp], log="idle-tp-gw.log")
    check(wait_up(gp, secs=90), "idle TP: a TP=2 group with --collective-timeout 2 is up")
    time.sleep(9)
    st, d = post(gp, "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
    kids = children(w.pid, "exe")  # ranks re-run /proc/self/exe
    check(st == 200 and w.poll() is None and len(kids) == 1,
          "idle TP: after 9 s idle (4.5 deadlines) the group still answers (%d, rank 0 %s, %d child rank)"
          % (st, "alive" if w.poll() is None else "exited %s" % w.returncode, len(kids)))
    log = open(os.path.join(EMPTY, "worker-%d.log" % wp), errors="replace").read()
    check("did not finish" not in log, "idle TP: no collective went past its deadline")
    w.terminate()
    g.terminate()
    w.wait()

    # a load that stalls: rank 1 of a TP=2 group stopped (SIGSTOP) once the group formed, as a rank whose
    # volume hangs (the model file itself must be a regular file: a FIFO is refused before any read)
    log = os.path.join(EMPTY, "stalled.log")
    t0 = time.time()
    with open(log, "w") as lf:
        p = subprocess.Popen([BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % (wp + 3),
                              "--tensor-parallel-size", "2", "--threads", "1", "--health-port", str(hp),
                              "--load-timeout", "3", "--join-timeout", "30"], stdout=lf, stderr=subprocess.STDOUT,
                             cwd=EMPTY)
    procs.append(p)
    live, stopped = None, []
    while time.time() - t0 < 30 and p.poll() is None and not stopped:
        if "rank 0 of 2" in open(log, errors="replace").read():  # loaded: the group has formed
            try:
                live = get(hp, "/live", timeout=1)[0]
            except OSError:
                pass
            for k in children(p.pid, "exe"):
                os.kill(k, signal.SIGSTOP)
                stopped.append(k)
        time.sleep(0.02)
    t1 = time.time()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    out = open(log, errors="replace").read()
    check(live == 200, "load deadline: /live answers 200 while the load is within --load-timeout (%s)" % live)
    check(stopped and p.returncode == 1 and "--load-timeout" in out and time.time() - t1 <= 10,
          "load deadline: a group whose rank stalls mid-load ends, exit %s %.1f s after the stall (%s)"
          % (p.returncode, time.time() - t1, out.strip().splitlines()[-1][-120:] if out.strip() else ""))

    cp = BASE + 103
    r = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % (wp + 4),
                        "--tensor-parallel-size", "2", "--rank", "0", "--group-address", "tcp://127.0.0.1:%d" % cp,
                        "--join-timeout", "2", "--threads", "1"], capture_output=True, text=True, timeout=60, cwd=EMPTY)
    check(r.returncode != 0 and "--join-timeout" in r.stderr,
          "join deadline: a rank that never joins ends rank 0 past --join-timeout (%s)" % r.stderr.strip()[-100:])
    # a LeaderWorkerSet whose size disagrees with the flags is refused before any join
    r = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--tensor-parallel-size", "4", "--ranks-per-node",
                        "2", "--node-index", "0"], capture_output=True, text=True, timeout=60, cwd=EMPTY,
                       env=dict(os.environ, LWS_GROUP_SIZE="3"))
    check(r.returncode == 2 and "LWS_GROUP_SIZE 3" in r.stderr,
          "lws: LWS_GROUP_SIZE 3 pods x 2 ranks against TP=4 is refused by name (%s)" % r.stderr.strip()[-90:])


def main():
    try:
        # LLMSERVE_FAULTS_ONLY=more,fd runs only those parts (for chasing one failure)
        only = set(filter(None, os.environ.get("LLMSERVE_FAULTS_ONLY", "").split(",")))
        want = lambda part: not only or part in only
        if want("serve"):
            serve_checks()
        wp, gp, sp = BASE + 10, BASE + 11, BASE + 12
        w = worker(wp)
        g = gateway(gp, [wp], "--max-body-bytes", str(8 << 20))
        gateway(sp, [wp], "--max-queue", "2", log="small.log")
        check(wait_up(gp) and wait_up(sp), "gateways from an empty folder are up (no model file)")
        if want("http"):
            http_checks(gp)
        if want("hostile"):
            hostile_checks(gp, 8 << 20)
        if want("hangup"):
            hangup_checks(gp, sp, g.pid)
        for part, fn in (("auth", auth_checks), ("more", more_checks), ("fd", fd_checks), ("groups", group_checks),
                         ("deadline", deadline_checks), ("secret", secret_checks), ("probes", probe_checks),
                         ("nodes", node_checks), ("tpdeadline", deadline_group_checks)):
            if want(part):
                fn()
        del w
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    print("faults e2e: %d checks failed" % len(failures))
    if failures:
        for name in sorted(os.listdir(EMPTY)):
            if name.endswith(".log"):
                lines = open(os.path.join(EMPTY, name), errors="replace").readlines()
                # a sanitizer's report is worth more than the log's tail
                first = next((i for i, l in enumerate(lines) if "Sanitizer" in l or "runtime error" in l), None)
                print("---- %s (%s)" % (name, "sanitizer report" if first is not None else "tail"))
                print("".join(lines[first:first + 40] if first is not None else lines[-15:]))
    return 1 if failures else 0


sys.exit(main())
