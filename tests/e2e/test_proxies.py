"""Behind real proxies that pool their upstream connections, as deployments
put llmserve: haproxy with `http-reuse always` and nginx with an upstream
`keepalive` pool, each in front of two gateways over one worker group.
16 clients send 200 requests through each proxy, streamed and plain in
turn, each on its own kept-alive client connection; every answer must come
whole within its deadline and carry its own request's marker (the prompt,
echoed), never another client's bytes. The gateways' accepted-connection
counters show the proxies really reused their upstream connections, so
the keep-alive path after a stream was taken hundreds of times.

  test_proxies.py BUILD_DIR MODEL

Each proxy skips with a clear message where it is not installed; exit 77
when neither is."""
import json
import os
import re
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Harness  # noqa: E402
from httpwire import Conn, Hung, request, sse_events  # noqa: E402

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
BASE = 30000 + os.getpid() % 2500  # below the ephemeral range (32768+)
H = Harness("llmserve-proxies-")
TMP, check, start, procs = H.tmp, H.check, H.start, H.procs
CLIENTS, REQUESTS = 16, 200


def health(port):
    try:
        c = Conn(port, timeout=2)
        c.send(request("GET", "/health"))
        st, _, d = c.response()
        c.close()
        return st == 200 and b'"workers_up":1' in d
    except (OSError, Hung, EOFError, ValueError):
        return False


def wait(fn, secs=90):
    t = time.time() + secs
    while time.time() < t:
        if fn():
            return True
        time.sleep(0.2)
    return False


def accepted(port):
    c = Conn(port)
    c.send(request("GET", "/metrics"))
    _, _, d = c.response()
    c.close()
    m = re.search(rb"^llmserve:http_connections_total (\d+)", d, re.M)
    return int(m.group(1)) if m else -1


def client(port, cid, n, out):
    """n requests on one kept-alive connection (a new one only after the proxy closed it)."""
    c = None
    for k in range(n):
        marker = "client %d request %d:" % (cid, k)
        stream = (cid + k) % 2 == 0
        req = request("POST", "/v1/completions", {"prompt": marker, "max_tokens": 3, "echo": True, "stream": stream,
                                                  "temperature": 0})
        t0 = time.monotonic()
        try:
            if c is None:
                c = Conn(port, timeout=30)
            c.send(req)
            st, h, b = c.response()
            if stream:
                ev = sse_events(b)
                text = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1] if '"choices"' in e)
                ok = st == 200 and ev[-1] == "[DONE]" and text.startswith(marker)
            else:
                text = json.loads(b)["choices"][0]["text"]
                ok = st == 200 and text.startswith(marker)
            out.append(("ok" if ok else "wrong", stream, time.monotonic() - t0, "%s %r" % (st, text[:60])))
            if "close" in h.get("connection", ""):
                c.close()
                c = None
        except (Hung, EOFError, OSError, ValueError, KeyError, IndexError) as e:
            out.append(("hung" if isinstance(e, Hung) else "error", stream, time.monotonic() - t0, repr(e)[:80]))
            if c:
                c.close()
            c = None
    if c:
        c.close()


def through(name, port, g_ports):
    a0 = sum(accepted(p) for p in g_ports)
    out, threads = [], []
    per = REQUESTS // CLIENTS
    for i in range(CLIENTS):
        n = per + (1 if i < REQUESTS - per * CLIENTS else 0)
        threads.append(threading.Thread(target=client, args=(port, i, n, out)))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    took = time.monotonic() - t0
    a1 = sum(accepted(p) for p in g_ports)
    bad = [o for o in out if o[0] != "ok"]
    lat = sorted(o[2] for o in out)
    print("%s: %d requests (%d streamed) from %d clients in %.1f s; p50 %.0f ms, max %.0f ms; the gateways accepted %d "
          "connections" % (name, len(out), sum(1 for o in out if o[1]), CLIENTS, took, 1e3 * lat[len(lat) // 2],
                           1e3 * lat[-1], a1 - a0))
    for o in bad[:5]:
        print("   %s (%s): %s" % (o[0], "stream" if o[1] else "plain", o[3]))
    check(len(out) == REQUESTS, "%s: all %d requests answered" % (name, REQUESTS))
    check(not any(o[0] == "hung" for o in out), "%s: none hung (%d did)" % (name, sum(1 for o in out if o[0] == "hung")))
    check(not bad, "%s: every answer whole and carrying its own request's marker (%d not)" % (name, len(bad)))
    # each streamed answer is followed by reuse of its upstream connection: far fewer connections than requests
    check(0 < a1 - a0 <= REQUESTS // 4, "%s: the proxy reused its upstream connections (%d accepted for %d requests)"
          % (name, a1 - a0, REQUESTS))


def haproxy_cfg(port, g_ports):
    return """global
    maxconn 512
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 30s
frontend llm
    bind 127.0.0.1:%d
    default_backend gateways
backend gateways
    balance roundrobin
    http-reuse always
%s""" % (port, "".join("    server g%d 127.0.0.1:%d\n" % (i, p) for i, p in enumerate(g_ports)))


def nginx_cfg(port, g_ports):
    return """daemon off;
master_process off;
worker_processes 1;
pid %s/nginx.pid;
error_log %s/nginx-error.log warn;
events { worker_connections 512; }
http {
    access_log off;
    client_body_temp_path %s/nginx-body;
    proxy_temp_path %s/nginx-proxy;
    upstream gateways {
%s        keepalive 16;
    }
    server {
        listen 127.0.0.1:%d;
        location / {
            proxy_pass http://gateways;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 60s;
        }
    }
}
""" % (TMP, TMP, TMP, TMP, "".join("        server 127.0.0.1:%d;\n" % p for p in g_ports), port)


def main():
    have = [p for p in ("haproxy", "nginx") if shutil.which(p) or os.path.exists("/usr/sbin/" + p)]
    for p in ("haproxy", "nginx"):
        if p not in have:
            print("%s not installed: its part is skipped (apt-get install %s)" % (p, "nginx-light" if p == "nginx" else p))
    if not os.path.isfile(MODEL):
        print("model %s not found: run tools/setup.sh" % MODEL)
        return 77
    if not have:
        return 77
    try:
        wp, g_ports = BASE, [BASE + 1, BASE + 2]
        start([BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % wp, "--kv-cache-memory",
               "256MiB", "--max-model-len", "2048", "--log-level", "warn"], "worker.log")
        for p in g_ports:
            start([BUILD + "/llmserve-gateway", "--port", str(p), "--workers", "tcp://127.0.0.1:%d" % wp, "--log-level",
                   "warn"], "gateway-%d.log" % p)
        check(wait(lambda: all(health(p) for p in g_ports)), "a worker group and two gateways are up")
        if "haproxy" in have:
            cfg = os.path.join(TMP, "haproxy.cfg")
            open(cfg, "w").write(haproxy_cfg(BASE + 3, g_ports))
            start([shutil.which("haproxy") or "/usr/sbin/haproxy", "-db", "-f", cfg], "haproxy.log")
            check(wait(lambda: health(BASE + 3), 20), "haproxy (http-reuse always) answers")
            through("haproxy http-reuse always", BASE + 3, g_ports)
        if "nginx" in have:
            cfg = os.path.join(TMP, "nginx.conf")
            open(cfg, "w").write(nginx_cfg(BASE + 4, g_ports))
            start([shutil.which("nginx") or "/usr/sbin/nginx", "-c", cfg, "-e", os.path.join(TMP, "nginx-error.log")],
                  "nginx.log")
            check(wait(lambda: health(BASE + 4), 20), "nginx (upstream keepalive 16) answers")
            through("nginx upstream keepalive", BASE + 4, g_ports)
        check(H.running(), "every process still runs")
    finally:
        rc = H.finish("proxies e2e")
    return rc


sys.exit(main())
