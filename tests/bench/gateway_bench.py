"""Gateway overhead, side by side with the worker alone (llmserve-rpc-bench).

  python3 tests/bench/gateway_bench.py BUILD_DIR MODEL

Starts one worker and one gateway on loopback, then measures:
  1. TTFT and inter-token latency of single greedy streams through the
     gateway (raw-socket SSE client), next to llmserve-rpc-bench's direct
     numbers against the same worker build in the same run;
  2. requests/s for short cached requests (1 token, same prompt, 16 clients);
  3. gateway memory per open stream (RSS with 100 streams open vs idle).
"""
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

build, model = sys.argv[1], sys.argv[2]
base = 20000 + os.getpid() % 12000  # below the ephemeral range (32768+)
wp = subprocess.Popen([build + "/llmserve-worker", "--model", model, "--listen", "tcp://127.0.0.1:%d" % base,
                       "--max-model-len", "2048", "--kv-cache-memory", "512MiB", "--log-level", "warn"])
gp = subprocess.Popen([build + "/llmserve-gateway", "--model", model, "--port", str(base + 1), "--workers",
                       "tcp://127.0.0.1:%d" % base, "--log-level", "warn", "--no-log-requests", "--max-queue", "4096"])


def post(body, stream):
    s = socket.create_connection(("127.0.0.1", base + 1))
    b = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(b) + b)
    return s


def stream_times(prompt, n):
    t0 = time.perf_counter()
    s = post({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, "ignore_eos": True}, True)
    f = s.makefile("rb")
    times = []
    for line in f:
        if line.startswith(b"data: {"):
            times.append(time.perf_counter())
        elif line.startswith(b"data: [DONE]"):
            break
    s.close()
    return times[0] - t0, [b - a for a, b in zip(times, times[1:])]


for _ in range(600):
    try:
        s = socket.create_connection(("127.0.0.1", base + 1))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        up = s.recv(100).startswith(b"HTTP/1.1 200")
        s.close()
        if up:
            break
    except OSError:
        pass
    time.sleep(0.2)
stream_times("warm up", 2)

# 1. latency through the gateway
ttfts, itls = [], []
for i in range(4):
    t, g = stream_times("Latency probe %d:" % i, 128)
    ttfts.append(t)
    itls += g
itls.sort()
print("through the gateway: TTFT p50 %.2f ms, ITL p50 %.3f ms, p99 %.3f ms (4 x 128 tokens)"
      % (statistics.median(ttfts) * 1e3, statistics.median(itls) * 1e3, itls[int(0.99 * (len(itls) - 1))] * 1e3))
gp_rss0 = 0
print(subprocess.run([build + "/llmserve-rpc-bench", "--worker", build + "/llmserve-worker", "--model", model,
                      "--requests", "4", "--gen", "128"], capture_output=True, text=True).stdout.strip())

# 2. short cached requests per second
done = []
stop = time.time() + 10


def client():
    body = {"prompt": "The same short cached prompt for every request.", "max_tokens": 1, "temperature": 0}
    while time.time() < stop:
        s = post(body, False)
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
        while len(rest) < length:
            rest += s.recv(65536)
        s.close()
        done.append(1)


t0 = time.time()
th = [threading.Thread(target=client) for _ in range(16)]
for t in th:
    t.start()
for t in th:
    t.join()
print("short cached requests: %.0f requests/s (16 clients, 1 token each, 10 s)" % (len(done) / (time.time() - t0)))


# 3. memory per open stream
def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int([l for l in f if l.startswith("VmRSS:")][0].split()[1])


time.sleep(1)
rss0 = rss_kb(gp.pid)
socks = [post({"prompt": "stream %d" % i, "max_tokens": 1500, "stream": True, "ignore_eos": True}, True)
         for i in range(100)]
time.sleep(3)
rss1 = rss_kb(gp.pid)
print("gateway memory: %d kB idle, %d kB with 100 open streams: %.1f kB per stream" % (rss0, rss1, (rss1 - rss0) / 100))
for s in socks:
    s.close()
gp.terminate()
wp.terminate()
gp.wait()
wp.wait()
