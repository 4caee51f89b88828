"""HTTP/1.1 under connection reuse, on the wire, against real processes on
loopback: a keep-alive connection is answered after every kind of response
(streamed, plain, refused, ended by an error or a drain), pipelined requests
are answered in order, chunked bodies are framed as RFC 9112 says, and the
smaller defects found by the same probes stay fixed.

  test_http.py BUILD_DIR MODEL [RSS_SLACK_MB]

Every read has a deadline: a hang is a failure with its name, never a stuck
test."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Harness  # noqa: E402
from httpwire import Conn, Hung, request, sse_events  # noqa: E402

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
RSS_SLACK = float(sys.argv[3]) if len(sys.argv) > 3 else 8  # MB; under ASan its quarantine keeps freed memory
if not os.path.isfile(MODEL):
    print("model %s not found: run tools/setup.sh" % MODEL)
    sys.exit(77)
BASE = 12000 + os.getpid() % 8000  # below the ephemeral range
H = Harness("llmserve-http-")
TMP, check, start, procs = H.tmp, H.check, H.start, H.procs
KEY = "k-http"


def gateway(port, wport, *extra):
    return start([BUILD + "/llmserve-gateway", "--port", str(port), "--workers", "tcp://127.0.0.1:%d" % wport,
                  "--api-key", KEY, "--log-level", "info"] + list(extra), "gateway-%d.log" % port)


def wait_up(port, secs=90):
    t = time.time() + secs
    while time.time() < t:
        try:
            c = Conn(port, timeout=2)
            c.send(request("GET", "/health"))
            st, _, d = c.response()
            c.close()
            if st == 200 and b'"workers_up":1' in d:
                return True
        except (OSError, Hung, EOFError, ValueError):
            pass
        time.sleep(0.2)
    return False


def gen(path="/v1/completions", stream=True, max_tokens=4, **kw):
    body = {"max_tokens": max_tokens, "stream": stream, **kw}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Say hi"}]
    else:
        body["prompt"] = "Once upon a time"
    return request("POST", path, body, key=KEY)


def is_stream(st, h, body):
    ev = sse_events(body)
    return st == 200 and h.get("content-type", "").startswith("text/event-stream") and ev and ev[-1] == "[DONE]"


def is_health(st, body):
    return st == 200 and json.loads(body).get("status") == "ok"


def reuse_checks(port):
    """The issue's cases: a keep-alive connection after a stream, of every endpoint that streams."""
    for path in ("/v1/completions", "/v1/chat/completions"):
        name = path.rsplit("/", 1)[-1]
        c = Conn(port)
        try:
            c.send(gen(path))
            st, h, b = c.response()
            check(is_stream(st, h, b), "%s: the stream ends with data: [DONE]" % name)
            check("close" not in h.get("connection", ""), "%s: the stream does not say Connection: close" % name)
            c.send(request("GET", "/health"))
            st, _, b = c.response(timeout=5)
            check(is_health(st, b), "%s: stream -> GET on the same connection answered" % name)
            c.send(gen(path))
            st, h, b = c.response()
            check(is_stream(st, h, b), "%s: stream -> stream on the same connection" % name)
            c.send(gen(path, stream=False))
            st, h, b = c.response(timeout=20)
            check(st == 200 and json.loads(b)["choices"], "%s: stream -> POST (not streamed) on the same connection" % name)
            c.send(gen(path))
            st, h, b = c.response()
            check(is_stream(st, h, b), "%s: plain -> stream on the same connection" % name)
        except (Hung, EOFError, OSError, ValueError) as e:
            check(False, "%s: reuse after a stream: %s" % (name, e))
        c.close()
    # pipelined: three requests in one write, a stream first; the answers come in order
    c = Conn(port)
    try:
        c.send(gen() + request("GET", "/health") + gen(stream=False, max_tokens=2) + request("GET", "/v1/models", key=KEY))
        st, h, b = c.response()
        ok1 = is_stream(st, h, b)
        st, _, b = c.response(timeout=5)
        ok2 = is_health(st, b)
        st, _, b = c.response(timeout=20)
        ok3 = st == 200 and json.loads(b)["object"] == "text_completion"
        st, _, b = c.response(timeout=5)
        ok4 = st == 200 and json.loads(b)["object"] == "list"
        check(ok1 and ok2 and ok3 and ok4, "pipelined stream, GET, POST, GET in one write: answered in order (%s)"
              % [ok1, ok2, ok3, ok4])
    except (Hung, EOFError, OSError, ValueError) as e:
        check(False, "pipelined requests after a stream: %s" % e)
    c.close()
    # a stream refused before its 200, then reuse
    c = Conn(port)
    try:
        c.send(gen(max_tokens=-3))
        st, h, b = c.response()
        c.send(request("GET", "/health"))
        st2, _, b2 = c.response(timeout=5)
        check(st == 400 and is_health(st2, b2), "a stream refused with 400 -> GET on the same connection")
    except (Hung, EOFError, OSError, ValueError) as e:
        check(False, "reuse after a refused stream: %s" % e)
    c.close()
    # 401 and 404 and 405, then reuse
    c = Conn(port)
    try:
        c.send(request("POST", "/v1/completions", {"prompt": "x"}) + request("GET", "/nope") +
               request("GET", "/v1/completions") + request("GET", "/health"))
        sts = [c.response(timeout=5)[0] for _ in range(4)]
        check(sts == [401, 404, 405, 200], "401, 404, 405 then 200 on one pipelined connection (%s)" % sts)
    except (Hung, EOFError, OSError, ValueError) as e:
        check(False, "reuse after errors: %s" % e)
    c.close()


def half_close_checks(port):
    """A client that half-closes (FIN after its request) is taken as gone, as uvicorn (vLLM's server) and nginx
    (without proxy_ignore_client_abort) take it: its request is cancelled on the worker at once, and the
    connection closes. Never a hang, never a request computed for nobody."""
    log = os.path.join(TMP, "gateway-%d.log" % port)
    for stream in (False, True):
        n0 = open(log).read().count("code=client_closed")
        c = Conn(port)
        try:
            c.send(gen(stream=stream, max_tokens=4000, ignore_eos=True))
            if stream:
                c.wait_for(b"data: ", 20)
            t0 = time.monotonic()
            c.s.shutdown(socket.SHUT_WR)
            closed = c.closed_within(5)
            took = time.monotonic() - t0
            time.sleep(0.3)
            n = open(log).read().count("code=client_closed") - n0
            check(closed and n == 1, "a client that half-closes during its %s request: cancelled (499 logged) and closed "
                  "in %.2f s" % ("streamed" if stream else "plain", took))
        except (Hung, EOFError, OSError, ValueError) as e:
            check(False, "half-close (%s): %s" % ("stream" if stream else "plain", e))
        c.close()


def error_stream_checks(port):
    """A stream ended by an error event (the request's deadline cancels it on the worker)."""
    c = Conn(port)
    try:
        c.send(gen(max_tokens=4000, ignore_eos=True))
        st, h, b = c.response(timeout=30)
        ev = sse_events(b)
        err = [json.loads(e)["error"] for e in ev[:-1] if '"error"' in e]
        check(st == 200 and err and err[0]["code"] == "timeout" and ev[-1] == "[DONE]",
              "a stream past --request-timeout ends with an error event, then [DONE] (%s)" % (err[:1],))
        c.send(request("GET", "/health"))
        st, _, b = c.response(timeout=5)
        check(is_health(st, b), "stream ended by an error -> GET on the same connection answered")
    except (Hung, EOFError, OSError, ValueError) as e:
        check(False, "a stream ended by an error, then reuse: %s" % e)
    c.close()


def drain_checks(wport):
    port = BASE + 13
    g = gateway(port, wport, "--shutdown-timeout", "1")
    if not wait_up(port):
        check(False, "drain: the gateway came up")
        return
    c = Conn(port, timeout=30)
    idle = Conn(port)  # a keep-alive connection that has had a stream and waits for its next request
    try:
        idle.send(gen())
        st, h, b = idle.response()
        c.send(gen(max_tokens=4000, ignore_eos=True))
        c.wait_for(b"data: ", 20)  # the stream has begun
        g.send_signal(signal.SIGTERM)
        st, h, b = c.response(timeout=30)
        ev = sse_events(b)
        codes = [json.loads(e)["error"]["code"] for e in ev[:-1] if '"error"' in e]
        check(codes == ["shutting_down"] and ev[-1] == "[DONE]",
              "drain: a stream past --shutdown-timeout ends with a shutting_down event, then data: [DONE] (%s)" % codes)
        check(c.closed_within(10) and idle.closed_within(10), "drain: the connections close as the gateway exits")
        check(g.wait(20) == 0, "drain: the gateway exits 0")
    except (Hung, EOFError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        check(False, "drain: %s" % e)
    c.close()
    idle.close()


def framing_checks(port):
    """Chunked bodies, leading empty lines, transfer codings, CONNECT."""
    body = json.dumps({"prompt": "Once upon", "max_tokens": 2}).encode()
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            % KEY).encode()

    def chunked(data, ext=b"", te=b"chunked", trailer=b""):
        half = len(data) // 2
        return (head + b"Transfer-Encoding: " + te + b"\r\n\r\n" +
                b"%x%s\r\n" % (half, ext) + data[:half] + b"\r\n" +
                b"%X\r\n" % (len(data) - half) + data[half:] + b"\r\n" + b"0\r\n" + trailer + b"\r\n")

    def one(req, what, want, timeout=20, then_health=True):
        c = Conn(port)
        try:
            c.send(req)
            st, h, b = c.response(timeout=timeout)
            err = json.loads(b).get("error", {}) if b.startswith(b"{") else {}
            ok = st == want and (st == 200 or err.get("message"))
            if st != 200:
                ok = ok and "close" in h.get("connection", "") and c.closed_within(5)
            elif then_health:
                c.send(request("GET", "/health"))
                ok = ok and is_health(*c.response(timeout=5)[::2])
            check(ok, "%s -> %d%s (%d %s)" % (what, want, "" if want == 200 else ", a JSON error, and the close",
                                               st, err.get("message", "")[:70]))
        except (Hung, EOFError, OSError, ValueError) as e:
            check(False, "%s: %s" % (what, e))
        c.close()

    one(chunked(body), "a chunked body", 200)
    one(chunked(body, ext=b";ext=1"), "a chunked body with a chunk extension (7;ext=1)", 200)
    one(chunked(body, ext=b' ; a=b ; q="x;y"'), "chunk extensions with blanks and a quoted value", 200)
    one(chunked(body, trailer=b"X-Checksum: 1\r\n"), "a chunked body with a trailer field", 200)
    one(chunked(body, te=b"Chunked"), "Transfer-Encoding: Chunked (names are case-insensitive)", 200)
    one(head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n", "a malformed chunk size (zz)", 400)
    one(head + b"Transfer-Encoding: chunked\r\n\r\n5x\r\nabcde\r\n0\r\n\r\n", "a chunk size with junk after it (5x)", 400)
    one(head + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n", "chunk data longer than its size", 400)
    one(chunked(body, te=b"gzip, chunked"), "Transfer-Encoding: gzip, chunked", 501)
    one(chunked(body, te=b"chunked, gzip"), "Transfer-Encoding: chunked, gzip (chunked not last)", 400)
    one(head + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        "Transfer-Encoding together with Content-Length", 400)
    one(head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % (2 << 20) + b"a" * (2 << 20) + b"\r\n0\r\n\r\n",
        "a chunked body over --max-body-bytes", 413)
    one(b"\r\n\r\n\n" + request("GET", "/health"), "empty lines before the request line (RFC 9112 §2.2)", 200)
    one(request("GET", "/health", headers={"X-Folded": "a\r\n b"}), "an obs-fold header line", 400)
    # a chunked request pipelined behind a stream, then a GET
    c = Conn(port)
    try:
        c.send(gen() + chunked(body) + request("GET", "/health"))
        a = is_stream(*c.response())
        st, _, b = c.response(timeout=20)
        bb = st == 200 and json.loads(b)["object"] == "text_completion"
        cc = is_health(*c.response(timeout=5)[::2])
        check(a and bb and cc, "stream, chunked POST, GET pipelined: answered in order (%s)" % [a, bb, cc])
    except (Hung, EOFError, OSError, ValueError) as e:
        check(False, "a chunked request pipelined behind a stream: %s" % e)
    c.close()
    # a malformed request pipelined behind a stream: the stream finishes whole, then the 400 and the close
    c = Conn(port)
    try:
        c.send(gen() + head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
        a = is_stream(*c.response())
        st, h, b = c.response(timeout=5)
        check(a and st == 400 and c.closed_within(5),
              "a malformed chunked request pipelined behind a stream: the stream whole, then 400 and the close (%s)" % st)
    except (Hung, EOFError, OSError, ValueError) as e:
        check(False, "a malformed request behind a stream: %s" % e)
    c.close()
    # CONNECT: 501 with Connection: close, and the socket really closes
    c = Conn(port)
    try:
        c.send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        st, h, b = c.response(timeout=5)
        check(st == 501 and "close" in h.get("connection", "") and c.closed_within(3),
              "CONNECT -> 501 with Connection: close, and the connection closes (%s %s)" % (st, h.get("connection")))
    except (Hung, EOFError, OSError, ValueError) as e:
        check(False, "CONNECT: %s" % e)
    c.close()


def auth_log_checks(port):
    log = os.path.join(TMP, "gateway-%d.log" % port)
    n0 = open(log).read().count("status=401")
    c = Conn(port)
    for _ in range(20):  # a burst: one warning line a second at most, but every request in the access log
        c.send(request("POST", "/v1/completions", {"prompt": "x"}, key="wrong"))
        c.response(timeout=5)
    c.close()
    time.sleep(2.5)  # the burst's tail is reported once it is over
    text = open(log).read()
    n = text.count("status=401") - n0
    check(n == 20, "every failed-auth 401 has its access-log line (%d of 20)" % n)
    warned = len(re.findall(r"401: wrong API key", text))
    told = sum(int(x) for x in re.findall(r"401: wrong API key .*?\((\d+) more", text))
    told += sum(int(x) for x in re.findall(r"401: (\d+) more failed API-key checks", text))
    check(warned + told >= 20, "the 401 warnings account for the whole burst, its tail too (%d lines + %d counted)"
          % (warned, told))


def api_checks(port, oport):
    """CORS as vLLM answers it (preflights, Allow-Origin on replies; a gateway limited to one origin refuses
    the others by name) and GET /v1/models/{id}."""
    def one(p, req, timeout=10):
        c = Conn(p)
        try:
            c.send(req)
            return c.response(timeout=timeout)
        finally:
            c.close()
    pre = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    st, h, b = one(port, request("OPTIONS", "/v1/chat/completions", headers=pre))
    check(st == 200 and h.get("access-control-allow-origin") == "*" and "POST" in h.get("access-control-allow-methods", "")
          and h.get("access-control-allow-headers") == "authorization, content-type" and h.get("access-control-max-age") == "600",
          "CORS: a preflight is answered (%d %s)" % (st, {k: v for k, v in h.items() if k.startswith("access")}))
    st, h, b = one(port, request("GET", "/v1/models", key=KEY, headers={"Origin": "https://app.example"}))
    check(st == 200 and h.get("access-control-allow-origin") == "*", "CORS: a reply carries Access-Control-Allow-Origin")
    st, h, b = one(oport, request("OPTIONS", "/v1/completions", headers=pre))
    check(st == 400 and b"Disallowed CORS origin" in b, "CORS: another origin's preflight refused by name (%d %s)" % (st, b[:60]))
    st, h, b = one(oport, request("OPTIONS", "/v1/completions", headers=dict(pre, Origin="https://ok.example")))
    check(st == 200 and h.get("access-control-allow-origin") == "https://ok.example" and h.get("vary") == "Origin"
          and h.get("access-control-allow-credentials") == "true", "CORS: the listed origin is named back, with credentials")
    st, h, b = one(oport, request("GET", "/v1/models", key=KEY, headers={"Origin": "https://evil.example"}))
    check(st == 200 and "access-control-allow-origin" not in h, "CORS: no Allow-Origin for an origin not listed")
    st, h, b = one(port, request("OPTIONS", "/v1/completions"))
    check(st == 405, "OPTIONS without a preflight's headers is no preflight (%d)" % st)
    st, _, b = one(port, request("GET", "/v1/models", key=KEY))
    mid = json.loads(b)["data"][0]["id"]
    st, _, b = one(port, request("GET", "/v1/models/" + mid, key=KEY))
    j = json.loads(b) if st == 200 else {}
    check(st == 200 and j.get("id") == mid and j.get("object") == "model", "GET /v1/models/{id} retrieves the model")
    st, _, b = one(port, request("GET", "/v1/models/no%20such", key=KEY))
    check(st == 404 and json.loads(b)["error"]["code"] == "model_not_found" and "no such" in json.loads(b)["error"]["message"],
          "GET /v1/models/{id} of an unknown model: 404 naming it")


def startup_checks(up):
    """At the start the gateway is not ready while a group of --workers has not come up: a model only it
    serves may still be loading. Once all have, a group lost later does not unready it while another serves;
    --startup-wait bounds the wait for a group that never comes."""
    late, gp, never, gq = BASE + 21, BASE + 20, BASE + 23, BASE + 22
    def health(port):
        c = Conn(port, timeout=2)
        try:
            c.send(request("GET", "/health"))
            st, _, d = c.response(timeout=5)
            return st, json.loads(d)
        finally:
            c.close()
    for port, late_port, extra in ((gp, late, []), (gq, never, ["--startup-wait", "2"])):
        start([BUILD + "/llmserve-gateway", "--port", str(port), "--workers", "tcp://127.0.0.1:%d,tcp://127.0.0.1:%d"
               % (up, late_port), "--log-level", "info"] + extra, "gateway-%d.log" % port)
    seen, t = None, time.time()
    while time.time() - t < 30 and not seen:
        try:
            st, j = health(gp)
            seen = (st, j["status"], j["workers_loading"]) if j["workers_up"] >= 1 else None
        except (OSError, Hung, EOFError, ValueError):
            pass
        time.sleep(0.1)
    check(seen == (503, "loading", 1), "startup: one group up, one not yet: /health 503 'loading' (%s)" % (seen,))
    c = Conn(gp)
    c.send(request("GET", "/ready"))
    check(c.response(timeout=5)[0] == 503, "startup: /ready says the same")
    c.send(gen(stream=False))
    check(c.response(timeout=30)[0] == 200, "startup: requests are served meanwhile by the group that is up")
    c.close()
    lw = start([BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % late, "--kv-cache-memory",
                "64MiB", "--max-model-len", "512", "--threads", "1", "--log-level", "warn"], "worker-late.log")
    t, ok = time.time(), False
    while time.time() - t < 120 and not ok:
        try:
            st, j = health(gp)
            ok = st == 200 and j["workers_up"] == 2
        except (OSError, Hung, EOFError, ValueError):
            pass
        time.sleep(0.2)
    check(ok, "startup: ready once the late group is up")
    lw.terminate()
    lw.wait()
    time.sleep(1)
    check(health(gp)[0] == 200, "startup: a group lost after the start does not unready the gateway")
    t, ok = time.time(), False
    while time.time() - t < 30 and not ok:
        ok = health(gq)[0] == 200
        time.sleep(0.2)
    check(ok, "startup: --startup-wait 2 stops waiting for a group that never comes")


def rss_mb(pid):
    for ln in open("/proc/%d/status" % pid):
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) / 1024.0
    return 0.0


def memory_checks(port, pid):
    base = rss_mb(pid)
    body = b'{"prompt": "' + b"x" * (6 << 20) + b'", "max_tokens": "bad"}'
    c = Conn(port, timeout=30)
    statuses = []
    for _ in range(6):
        c.send(request("POST", "/v1/completions", body, key=KEY))
        statuses.append(c.response()[0])
    c.close()
    time.sleep(0.5)
    peak_after = rss_mb(pid)
    check(all(s == 400 for s in statuses), "6 MiB bodies refused with 400 (%s)" % statuses)
    check(peak_after - base < RSS_SLACK, "resident memory returns after refused multi-MB bodies: %.0f MB before, %.0f MB after"
          % (base, peak_after))


def main():
    try:
        wp, gp, tp = BASE + 10, BASE + 11, BASE + 12
        start([BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % wp, "--kv-cache-memory",
               "256MiB", "--max-model-len", "4096", "--log-level", "warn"], "worker.log")
        g = gateway(gp, wp, "--max-body-bytes", str(1 << 20), "--header-timeout", "5")
        gateway(tp, wp, "--request-timeout", "1")
        check(wait_up(gp) and wait_up(tp), "a worker and two gateways are up")
        reuse_checks(gp)
        half_close_checks(gp)
        error_stream_checks(tp)
        framing_checks(gp)
        auth_log_checks(gp)
        startup_checks(wp)
        op = BASE + 15
        gateway(op, wp, "--allowed-origins", '["https://ok.example"]', "--allow-credentials")
        if wait_up(op):
            api_checks(gp, op)
        g2 = gateway(BASE + 14, wp, "--log-level", "warn")  # the default 8 MiB body limit
        if wait_up(BASE + 14):
            memory_checks(BASE + 14, g2.pid)
        drain_checks(wp)
        check(g.poll() is None, "the gateway is still running after all of it")
    finally:
        rc = H.finish("http e2e")
    return rc


sys.exit(main())
