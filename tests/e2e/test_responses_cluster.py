"""The Responses API (and every other endpoint) across a cluster: two gateways sharing a real Redis
(--response-store redis://:PASSWORD@HOST:PORT/DB, a password and a database
of its own), two worker groups, haproxy in front (when it is
installed), driven by the `openai` SDK.

- A conversation continued turn by turn through alternating gateways (and
  through haproxy) gives the same greedy replies as the whole conversation
  sent at once; each turn is retrievable from every gateway at once, a
  streamed one as soon as its last event has arrived; a delete through one
  gateway is seen by the other.
- Redis frozen (SIGSTOP): a retrieve ends with 503 within the store's
  deadline, a stored create still answers, and chat requests through the same
  gateway are not held up; thawed, all works again.
- Redis killed: 503 at once; restarted, the gateways connect again by
  themselves.
- Chat, completions, Anthropic's messages and count_tokens (and, with
  LLMSERVE_EMBED_MODEL, an embedding group's embeddings, score and rerank)
  through each gateway and the balancer; files uploaded through one
  gateway, a batch created through the other (a shared --files-dir),
  polled and downloaded through the balancer.
- A gateway with the default memory store does not see the cluster's
  responses; a bad --response-store URL is refused at the start by name.

  test_responses_cluster.py BUILD_DIR MODEL
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("GW", "-")
from apiutil import check, finish, free_port, healthy, stop_and_check_logs  # noqa: E402

import openai  # noqa: E402

BUILD, MODEL = sys.argv[1], sys.argv[2]
REDIS = shutil.which("redis-server")
if not REDIS:
    print("skip: redis-server is not installed (apt-get install redis-server, or tools/setup.sh test)")
    sys.exit(77)
TMP = tempfile.mkdtemp(prefix="llmserve-resp-")
PROCS = []


def start(args, name):
    log = open(os.path.join(TMP, name + ".log"), "w")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    PROCS.append(p)
    return p


def wait_health(port, what, t=60):
    if healthy(port, t):
        return True
    print("FAIL %s not healthy; logs in %s" % (what, TMP))
    return False


def redis_start(port):
    p = start([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--daemonize", "no", "--requirepass", "s3cret"], "redis")
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return p
        except OSError:
            time.sleep(0.05)
    return p


def cleanup():
    stop_and_check_logs(PROCS, TMP, "responses cluster")


try:
    RP = free_port()
    redis = redis_start(RP)
    W = [free_port(), free_port()]
    for i, w in enumerate(W):
        start([BUILD + "/llmserve-worker", "--model", MODEL, "--kv-cache-memory", "256MiB", "--max-model-len", "2048",
               "--log-level", "warn", "--listen", "tcp://127.0.0.1:%d" % w], "worker%d" % i)
    workers = ",".join("tcp://127.0.0.1:%d" % w for w in W)
    EMB = os.environ.get("LLMSERVE_EMBED_MODEL", "")
    if os.path.isfile(os.path.join(EMB, "config.json")):  # an embedding group too, for score and rerank
        WE = free_port()
        start([BUILD + "/llmserve-worker", "--model", EMB, "--log-level", "warn", "--listen", "tcp://127.0.0.1:%d" % WE],
              "worker-embed")
        workers += ",tcp://127.0.0.1:%d" % WE
    else:
        EMB = ""
        print("note: no embedding model (LLMSERVE_EMBED_MODEL): score and rerank not run through the cluster")
    GP = [free_port(), free_port(), free_port()]
    store = ["--response-store", "redis://:s3cret@127.0.0.1:%d/2" % RP, "--response-store-timeout", "1",
             "--files-dir", os.path.join(TMP, "files")]
    for i in range(2):
        start([BUILD + "/llmserve-gateway", "--port", str(GP[i]), "--workers", workers, "--api-key", "k",
               "--log-level", "warn"] + store, "gateway%d" % i)
    start([BUILD + "/llmserve-gateway", "--port", str(GP[2]), "--workers", workers, "--api-key", "k", "--log-level",
           "warn"], "gateway-memory")
    ok = all(wait_health(p, "gateway %d" % p) for p in GP)
    # haproxy round robin over the two Redis gateways
    LB = None
    if shutil.which("haproxy") and ok:
        LB = free_port()
        cfg = os.path.join(TMP, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write("global\n  maxconn 256\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 120s\n"
                    "  timeout server 120s\nfrontend fe\n  bind 127.0.0.1:%d\n  default_backend gws\n"
                    "backend gws\n  balance roundrobin\n  server g0 127.0.0.1:%d\n  server g1 127.0.0.1:%d\n"
                    % (LB, GP[0], GP[1]))
        start(["haproxy", "-f", cfg, "-db"], "haproxy")
        time.sleep(0.5)
    else:
        print("note: haproxy not installed: the conversation alternates between the gateways directly")
    if not ok:
        sys.exit(1)

    def cl(port):
        return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="k", timeout=60, max_retries=0)

    g0, g1, gm = cl(GP[0]), cl(GP[1]), cl(GP[2])
    M = g0.models.list().data[0].id
    G = {"temperature": 0, "max_output_tokens": 16}

    # ---- a conversation through alternating gateways = the whole conversation at once ----------------
    turns = ["What is the capital of France?", "And of Germany?", "And of Italy?", "Which of them is largest?"]
    path = [g0, g1, cl(LB) if LB else g0, g1]
    prev, history, same = None, [], True
    for i, (t, c) in enumerate(zip(turns, path)):
        r = c.responses.create(model=M, input=t, previous_response_id=prev, **G)
        history += [{"role": "user", "content": t}]
        whole = g0.responses.create(model=M, input=history, store=False, **G)
        same = same and r.output_text == whole.output_text
        history += [{"role": "assistant", "content": r.output_text}]
        for other in (g0, g1):
            got = other.responses.retrieve(r.id)
            same = same and got.output_text == r.output_text and got.previous_response_id == prev
        prev = r.id
    check(same, "4 turns through gateway 0, 1, %s, 1: each the whole conversation's greedy reply, each retrievable "
          "from both gateways at once" % ("haproxy" if LB else "0"))
    with g1.responses.stream(model=M, input="One more: and of Spain?", previous_response_id=prev, **G) as s:
        for _ in s:
            pass
        fin = s.get_final_response()
    got = g0.responses.retrieve(fin.id)
    check(got.output_text == fin.output_text and got.previous_response_id == prev,
          "a stream through gateway 1: retrievable from gateway 0 as soon as its last event has come")
    g0.responses.delete(fin.id)
    try:
        g1.responses.retrieve(fin.id)
        check(False, "deleted through gateway 0: gateway 1 still has it")
    except openai.NotFoundError:
        check(True, "deleted through gateway 0: gone from gateway 1 too")
    try:
        gm.responses.retrieve(prev)
        check(False, "the memory-store gateway sees a Redis-stored response")
    except openai.NotFoundError:
        check(True, "a gateway with the memory store does not see the cluster's responses (404)")

    # ---- every other endpoint through the cluster: both gateways and the balancer ---------------------------
    import io
    import json
    hdr = {"Content-Type": "application/json", "Authorization": "Bearer k"}

    def post(port, path, body, extra=None):
        r = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), json.dumps(body).encode(),
                                   dict(hdr, **(extra or {})))
        try:
            with urllib.request.urlopen(r, timeout=60) as f:
                return f.status, json.loads(f.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    ports = [GP[0], GP[1]] + ([LB] if LB else [])
    okk = True
    for port in ports:
        st1, a = post(port, "/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": "Hi"}],
                                                     "max_tokens": 4, "temperature": 0})
        st2, b = post(port, "/v1/completions", {"model": M, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        st3, m = post(port, "/v1/messages", {"model": M, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
                      {"anthropic-version": "2023-06-01"})
        st4, n = post(port, "/v1/messages/count_tokens", {"model": M, "messages": [{"role": "user", "content": "Hi"}]})
        okk = okk and (st1, st2, st3, st4) == (200, 200, 200, 200) and m["type"] == "message" and n["input_tokens"] > 0
        if EMB:
            emb_id = os.path.basename(EMB.rstrip("/"))
            st5, e = post(port, "/v1/embeddings", {"model": emb_id, "input": ["a", "b"]})
            st6, sc = post(port, "/v1/score", {"model": emb_id, "text_1": "a cat", "text_2": ["a cat", "a car"]})
            st7, rr = post(port, "/v1/rerank", {"model": emb_id, "query": "a cat", "documents": ["a car", "a cat"]})
            okk = okk and (st5, st6, st7) == (200, 200, 200) and abs(sc["data"][0]["score"] - 1) < 1e-5 \
                and rr["results"][0]["index"] == 1
    check(okk, "chat, completions, messages, count_tokens%s through gateway 0, 1%s" % (
        ", embeddings, score, rerank" if EMB else "", " and haproxy" if LB else ""))
    f = g0.files.create(file=("b.jsonl", io.BytesIO("\n".join(json.dumps(
        {"custom_id": "x%d" % i, "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": M, "messages": [{"role": "user", "content": "Count to %d" % i}], "max_tokens": 4}})
        for i in range(6)).encode())), purpose="batch")
    bt = g1.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    lbc = cl(LB) if LB else g0
    for _ in range(200):
        bt = lbc.batches.retrieve(bt.id)
        if bt.status in ("completed", "failed", "cancelled", "expired"):
            break
        time.sleep(0.3)
    outl = lbc.files.content(bt.output_file_id).text.splitlines() if bt.output_file_id else []
    check(bt.status == "completed" and len(outl) == 6, "files and a batch: uploaded through gateway 0, created through 1, "
          "polled and downloaded through %s" % ("haproxy" if LB else "0"))

    # ---- Redis frozen: deadlines, and nothing else held up -------------------------------------------
    redis.send_signal(signal.SIGSTOP)
    chat_times = []

    def chats():
        for _ in range(3):
            t0 = time.time()
            g0.chat.completions.create(model=M, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0)
            chat_times.append(time.time() - t0)

    th = threading.Thread(target=chats)
    t0 = time.time()
    th.start()
    try:
        g0.responses.retrieve(prev)
        check(False, "Redis frozen: a retrieve succeeded")
    except openai.APIStatusError as e:
        check(e.status_code == 503 and time.time() - t0 < 5,
              "Redis frozen: a retrieve ends with 503 within the 1 s deadline (%.1f s)" % (time.time() - t0))
    t0 = time.time()
    r = g0.responses.create(model=M, input="Hello", **G)
    check(r.output_text and time.time() - t0 < 15, "Redis frozen: a stored create still answers (%.1f s; not stored)"
          % (time.time() - t0))
    th.join(60)
    check(len(chat_times) == 3 and max(chat_times) < 10, "chat requests through the same gateway meanwhile: %s s"
          % ["%.1f" % x for x in chat_times])
    redis.send_signal(signal.SIGCONT)
    time.sleep(0.3)
    got = g1.responses.retrieve(prev)
    check(got.id == prev, "Redis thawed: the conversation is there again")

    # ---- Redis killed, then back: the gateways connect again by themselves ------------------------------
    redis.kill()
    redis.wait()
    t0 = time.time()
    try:
        g1.responses.retrieve(prev)
        check(False, "Redis gone: a retrieve succeeded")
    except openai.APIStatusError as e:
        check(e.status_code == 503 and time.time() - t0 < 3, "Redis gone: 503 at once (%.2f s)" % (time.time() - t0))
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % GP[1], timeout=10) as f:
        met = dict(l.rsplit(" ", 1) for l in f.read().decode().splitlines() if l.startswith("llmserve:response_store_"))
    check(float(met.get("llmserve:response_store_errors_total", 0)) >= 1
          and float(met.get("llmserve:response_store_gets_total", 0)) >= 4,
          "/metrics: the store's failures and reads counted (%s)" % {k.split(":")[1]: v for k, v in met.items()})
    redis = redis_start(RP)
    r = g0.responses.create(model=M, input="Hello again", **G)
    got = g1.responses.retrieve(r.id)
    check(got.output_text == r.output_text, "Redis back (empty, no persistence): stored and read again through both")

    # ---- a bad URL is refused at the start ----------------------------------------------------------
    out = subprocess.run([BUILD + "/llmserve-gateway", "--port", "0", "--workers", workers, "--response-store",
                          "mongodb://x"], capture_output=True, text=True, timeout=20)
    check(out.returncode != 0 and "--response-store" in out.stderr, "--response-store mongodb://x: refused at the start "
          "(%s)" % out.stderr.strip()[:100])
finally:
    cleanup()
    if not [1 for x in sys.exc_info() if x]:
        shutil.rmtree(TMP, ignore_errors=True)
finish("test_responses_cluster")
