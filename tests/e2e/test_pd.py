"""Disaggregated prefill and decode end to end, with real worker processes,
real sockets and the real model.

  test_pd.py BUILD_DIR MODEL

A kv_producer group and a kv_consumer group behind one gateway
(--max-local-prefill-length 64), against one colocated group behind its own
gateway. Long prompts are prefilled by the producer, which sends their KV
blocks to the consumer worker to worker; the consumer adopts them and
decodes. Every answer (greedy and seeded, streamed and not) must be the
colocated group's. Then the faults: the producer lost holding a request
(prefilled elsewhere), the consumer lost mid-stream (resumed on the
producer), a consumer whose buffer cannot hold a transfer (it computes what
it lacks); and the flags that are refused."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import Harness, get, ready, sse  # noqa: E402
from ports import free_port  # noqa: E402

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
if not os.path.exists(MODEL):
    print("test_pd: model %s not found: skipped" % MODEL)
    sys.exit(77)
h = Harness("llmserve-pd-")
REF_W, REF_G, P_W, D_W, P_H, D_H, PD_G = (free_port() for _ in range(7))
WORDS = ("river stone lantern orchard copper meadow violin harbor thunder saffron glacier velvet compass "
         "ember quarry falcon willow cinder marble tundra").split()
PRODUCER = ["--kv-transfer-config", '{"kv_role": "kv_producer"}']
CONSUMER = ["--kv-transfer-config", '{"kv_role": "kv_consumer", "kv_buffer_size": 67108864}']


def prompt(i, words=220):
    w = [WORDS[(i * 7 + k * (i + 3)) % len(WORDS)] for k in range(words)]
    return "Document %d: %s. Summarise the document in one line." % (i, " ".join(w))


def worker(name, port, extra, health=None, threads=1):
    args = [BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % port,
            "--max-model-len", "1024", "--max-num-seqs", "8", "--threads", str(threads), "--log-level", "info"] + extra
    if health:
        args += ["--health-port", str(health), "--health-host", "127.0.0.1"]
    return h.start(args, name + ".log")


def gateway(name, port, wports, extra=()):
    return h.start([BUILD + "/llmserve-gateway", "--port", str(port), "--host", "127.0.0.1", "--workers",
                    ",".join("tcp://127.0.0.1:%d" % p for p in wports), "--log-level", "info"] + list(extra),
                   name + ".log")


MODEL_ID = {}


def body(gport, text, stream, max_tokens=24, **kw):
    if gport not in MODEL_ID:
        MODEL_ID[gport] = json.loads(get(gport, "/v1/models")[1])["data"][0]["id"]
    b = {"model": MODEL_ID[gport], "prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    b.update(kw)
    return urllib.request.Request("http://127.0.0.1:%d/v1/completions" % gport, json.dumps(b).encode(),
                                  {"Content-Type": "application/json"})


def complete(gport, text, stream=False, **kw):
    """(text, usage, finish_reason)."""
    with urllib.request.urlopen(body(gport, text, stream, **kw), timeout=120) as r:
        raw = r.read().decode()
    if not stream:
        d = json.loads(raw)
        return d["choices"][0]["text"], d["usage"], d["choices"][0]["finish_reason"]
    text, usage, fin = "", {}, None
    for d in sse(raw.splitlines()):
        if d.get("choices"):
            text += d["choices"][0].get("text", "")
            fin = d["choices"][0].get("finish_reason") or fin
        if d.get("usage"):
            usage = d["usage"]
    return text, usage, fin


def metric(port, name, labels=""):
    text = get(port, "/metrics")[1]
    m = re.search(r"^%s(?:\{[^}]*%s[^}]*\})? (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def settled(port, name, labels, want, t=10):
    """The worker's /metrics (refreshed by its loop every 0.5 s) once the series reaches want."""
    end, v = time.time() + t, None
    while time.time() < end:
        v = metric(port, name, labels)
        if v is not None and v >= want:
            return v
        time.sleep(0.3)
    return v


worker("ref-worker", REF_W, [], threads=2)
gateway("ref-gateway", REF_G, [REF_W])
pw = worker("prefill-worker", P_W, PRODUCER, P_H)
dw = worker("decode-worker", D_W, CONSUMER, D_H)
gateway("pd-gateway", PD_G, [P_W, D_W], ["--max-local-prefill-length", "64"])
ok = h.check(ready(REF_G) and ready(PD_G) and ready(P_H) and ready(D_H), "the gateways and both P/D workers are ready")
if ok:
    end = time.time() + 10
    while time.time() < end and metric(PD_G, "llmserve:worker_up", ":%d" % P_W) != 1:
        time.sleep(0.2)
    roles = get(PD_G, "/metrics")[1]
    h.check('worker="tcp://127.0.0.1:%d",role="kv_producer"' % P_W in roles and
            'worker="tcp://127.0.0.1:%d",role="kv_consumer"' % D_W in roles,
            "the gateway knows each group's role from its Health")
    h.check(metric(P_H, "llmserve:kv_role", 'role="kv_producer"') == 1 and
            metric(D_H, "llmserve:kv_role", 'role="kv_consumer"') == 1, "each worker's /metrics says its role")

    N = 4
    p_gen0 = settled(P_H, "vllm:generation_tokens_total", "", 0)  # its warm-up's
    ref = [complete(REF_G, prompt(i)) for i in range(N)]
    got = [complete(PD_G, prompt(i)) for i in range(N)]
    h.check([g[0] for g in got] == [r[0] for r in ref], "greedy: every P/D answer is the colocated group's")
    h.check([g[2] for g in got] == [r[2] for r in ref], "and ends for the same reason (%s)" % [g[2] for g in got])
    h.check(all(g[1]["completion_tokens"] == r[1]["completion_tokens"] for g, r in zip(got, ref)),
            "with the same completion token counts")
    gs = [complete(PD_G, prompt(i + 10), stream=True) for i in range(2)]
    rs = [complete(REF_G, prompt(i + 10), stream=True) for i in range(2)]
    h.check([g[0] for g in gs] == [r[0] for r in rs], "greedy, streamed: identical")
    seeded = dict(temperature=0.9, top_p=0.95, seed=5, max_tokens=32)
    gs = [complete(PD_G, prompt(i + 20), **seeded) for i in range(2)]
    rs = [complete(REF_G, prompt(i + 20), **seeded) for i in range(2)]
    h.check([g[0] for g in gs] == [r[0] for r in rs] and gs[0][0] != complete(REF_G, prompt(20), **dict(seeded, seed=6))[0],
            "seeded sampling: the decode group draws on where the prefill group's draw left off (identical)")
    disagg = metric(PD_G, "llmserve:disagg_prefill_requests_total")
    hand = metric(PD_G, "llmserve:disagg_handoffs_total")
    h.check(disagg == N + 4 and hand == N + 4, "every long prompt was prefilled by the producer and handed over "
            "(%s prefills, %s handoffs)" % (disagg, hand))
    recv = settled(D_H, "llmserve:kv_transfers_total", 'direction="received"', N + 4)
    sent = settled(P_H, "llmserve:kv_transfers_total", 'direction="sent"', N + 4)
    h.check(recv == N + 4 and sent == N + 4, "the workers count each transfer on both ends (sent %s, received %s)" %
            (sent, recv))
    blocks = metric(D_H, "llmserve:kv_transfer_blocks_total", 'direction="received"')
    h.check(blocks and blocks == metric(P_H, "llmserve:kv_transfer_blocks_total", 'direction="sent"') and
            blocks >= (N + 4) * 14, "every block sent was adopted (%s)" % blocks)
    h.check(metric(D_H, "llmserve:kv_transfer_bytes_total", 'direction="received"') == blocks * 368640,
            "bytes counted (368,640 a block of this model)")
    lat = metric(D_H, "llmserve:kv_transfer_seconds_sum")
    h.check(metric(D_H, "llmserve:kv_transfer_seconds_count") == recv and lat is not None,
            "the latency histogram has every transfer (mean %.2f ms from the last message's sending to its adoption)" %
            (1e3 * (lat or 0) / max(recv or 1, 1)))
    h.check(settled(D_H, "vllm:external_prefix_cache_hits_total", "", blocks * 16) == blocks * 16,
            "the decode group loaded every adopted block instead of computing it")
    p_gen = settled(P_H, "vllm:generation_tokens_total", "", p_gen0 + N + 4)
    h.check(p_gen == p_gen0 + N + 4, "the producer generated one token a request (%s after its warm-up's %s); the "
            "consumer the rest" % (p_gen, p_gen0))
    h.check(metric(D_H, "llmserve:kv_transfer_wait_expired_total") == 0, "no decode request waited out its transfer")
    h.check(all(g[1].get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0 for g in got),
            "usage: cached tokens are the prefill group's (none for new prompts), not the KV it sent")

    short = "Say hello."
    before = metric(PD_G, "llmserve:disagg_prefill_requests_total")
    h.check(complete(PD_G, short)[0] == complete(REF_G, short)[0] and
            metric(PD_G, "llmserve:disagg_prefill_requests_total") == before,
            "a short prompt is prefilled where it decodes, not handed over")
    # ... while the consumer has nothing else to do; while it decodes, a free producer takes a prompt of
    # --idle-prefill-min-length (32) or more, so the consumer's steps stay pure decode
    bg = threading.Thread(target=lambda: complete(PD_G, short, max_tokens=400, ignore_eos=True))
    bg.start()
    time.sleep(0.5)
    mid = prompt(41, words=30)
    before = metric(PD_G, "llmserve:disagg_prefill_requests_total")
    got_mid = complete(PD_G, mid, max_tokens=16)
    bg.join()
    h.check(got_mid[0] == complete(REF_G, mid, max_tokens=16)[0] and 32 <= got_mid[1]["prompt_tokens"] <= 64 and
            metric(PD_G, "llmserve:disagg_prefill_requests_total") == before + 1 and
            metric(PD_G, "llmserve:disagg_idle_decodes_total") == 1,
            "a %s-token prompt while the consumer decodes: prefilled by the free producer and decoded there "
            "(--idle-decode: it held fewer streams), answer identical" % got_mid[1]["prompt_tokens"])

    # such a guest stream is moved to the consumer when a long prompt is sent to its producer: cancelled there,
    # its prompt's KV adopted, the tokens it made computed again; its text and the long prompt's are unchanged
    guest, gkw = prompt(42, words=30), dict(max_tokens=200, ignore_eos=True)
    ref_guest, ref_lng = complete(REF_G, guest, **gkw)[0], complete(REF_G, prompt(43))[0]
    bg = threading.Thread(target=lambda: complete(PD_G, short, max_tokens=800, ignore_eos=True))
    bg.start()
    time.sleep(0.5)
    moved0, lng, text = metric(PD_G, "llmserve:disagg_idle_decodes_moved_total"), {}, ""
    recv0 = metric(D_H, "llmserve:kv_transfer_blocks_total", 'direction="received"')
    exp0 = metric(D_H, "llmserve:kv_transfer_wait_expired_total")
    lt = threading.Thread(target=lambda: lng.update(a=complete(PD_G, prompt(43))))
    with urllib.request.urlopen(body(PD_G, guest, True, **gkw), timeout=120) as r:
        for d in sse(r):
            if d.get("choices"):
                text += d["choices"][0].get("text", "")
            if len(text) > 200 and not lt.ident:
                lt.start()
    lt.join(60)
    bg.join()
    h.check(metric(PD_G, "llmserve:disagg_idle_decodes_total") == 2 and
            metric(PD_G, "llmserve:disagg_idle_decodes_moved_total") == moved0 + 1,
            "a guest stream on the producer was moved off it when a long prompt came")
    h.check(text == ref_guest, "the moved stream's text is the colocated group's (%d chars)" % len(text))
    h.check(lng.get("a", [None])[0] == ref_lng, "and so is the long prompt's answer")
    # the guest's transfer carried the blocks its tokens filled on the producer, not only its prompt's
    g_prompt, l_prompt = complete(REF_G, guest, max_tokens=1)[1]["prompt_tokens"], lng["a"][1]["prompt_tokens"]
    got_blocks = settled(D_H, "llmserve:kv_transfer_blocks_total", 'direction="received"', 0) - recv0
    h.check(got_blocks > l_prompt // 16 + g_prompt // 16, "the moved stream's generated tokens' KV went along (%d "
            "blocks received: %d the long prompt's, %d the guest's prompt's, the rest its output's)" %
            (got_blocks, l_prompt // 16, g_prompt // 16))
    h.check(metric(D_H, "llmserve:kv_transfer_wait_expired_total") == exp0, "and nothing waited out a transfer")

    # the producer lost while it holds a request: the request is prefilled elsewhere (here: where it decodes)
    pw.send_signal(signal.SIGSTOP)
    res = {}
    t = threading.Thread(target=lambda: res.update(a=complete(PD_G, prompt(30))))
    t.start()
    time.sleep(1.0)
    pw.send_signal(signal.SIGKILL)
    pw.wait()
    t.join(60)
    h.check(res.get("a", [None])[0] == complete(REF_G, prompt(30))[0],
            "producer killed holding a request: it is prefilled on the consumer, same answer")
    h.check(metric(PD_G, "llmserve:retried_total") >= 1, "counted as moved before its first token")
    pw = worker("prefill-worker-2", P_W, PRODUCER, P_H)
    h.check(ready(P_H), "the producer restarts")
    end = time.time() + 15
    while time.time() < end and metric(PD_G, "llmserve:worker_up", ":%d" % P_W) != 1:
        time.sleep(0.2)

    # the consumer lost mid-stream after the handoff: the stream resumes on the producer, text unchanged
    long_kw = dict(max_tokens=160, ignore_eos=True)
    ref_long = complete(REF_G, prompt(31), **long_kw)[0]
    before = metric(PD_G, "llmserve:disagg_handoffs_total")
    text, killed = "", False
    with urllib.request.urlopen(body(PD_G, prompt(31), True, **long_kw), timeout=120) as r:
        for d in sse(r):
            if d.get("choices"):
                text += d["choices"][0].get("text", "")
            if len(text) > 40 and not killed:
                dw.send_signal(signal.SIGKILL)
                killed = True
    dw.wait()
    h.check(killed and metric(PD_G, "llmserve:disagg_handoffs_total") == before + 1, "the stream was handed over, "
            "then its consumer killed")
    h.check(text == ref_long, "consumer killed mid-stream: the stream resumes on the producer, text identical")
    h.check(metric(PD_G, "llmserve:resumed_total") >= 1, "counted as resumed")

    # a consumer whose buffer cannot hold the transfer: it computes what it lacks, same answer
    dw = worker("decode-worker-small", D_W, ["--kv-transfer-config",
                                             '{"kv_role": "kv_consumer", "kv_buffer_size": 1048576}'], D_H)
    h.check(ready(D_H), "a consumer with a 1 MiB buffer starts")
    end = time.time() + 15
    while time.time() < end and metric(PD_G, "llmserve:worker_up", ":%d" % D_W) != 1:
        time.sleep(0.2)
    small = complete(PD_G, prompt(32))
    h.check(small[0] == complete(REF_G, prompt(32))[0], "a transfer that does not fit: the consumer computes the rest, "
            "same answer")
    dropped = settled(D_H, "llmserve:kv_tier_dropped_total", "", 1)
    hits = metric(D_H, "vllm:external_prefix_cache_hits_total")
    h.check(dropped and dropped >= 1 and hits is not None and hits <= 32,
            "its buffer dropped blocks (%s) and at most two came back (%s tokens)" % (dropped, hits))

# flags refused by name
for cfg, want in [('{"kv_role": "kv_both", "kv_connector": "NixlConnector"}', "kv_connector"),
                  ('{"kv_role": "prefill"}', "kv_role"), ("[1]", "JSON object")]:
    p = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--kv-transfer-config", cfg],
                       capture_output=True, text=True, timeout=60)
    h.check(p.returncode == 2 and want in p.stderr, "--kv-transfer-config %s refused naming %s" % (cfg, want))
p = subprocess.run([BUILD + "/llmserve-worker", "--model", MODEL, "--tensor-parallel-size", "2"] + PRODUCER,
                   capture_output=True, text=True, timeout=60)
h.check(p.returncode == 2 and "one rank" in p.stderr, "a producer with --tensor-parallel-size 2 is refused")
# every process still running stops with SIGTERM (a sanitizer build then runs its leak check); no report in any log
for p in h.procs:
    if p.poll() is None:
        p.send_signal(signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
for p in h.procs:
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
bad = [f for f in sorted(os.listdir(h.tmp)) if f.endswith(".log") and any(
    m in open(os.path.join(h.tmp, f), errors="replace").read()
    for m in ("runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "ThreadSanitizer"))]
h.check(not bad, "no sanitizer report in the processes' logs %s" % bad)
sys.exit(h.finish("test_pd"))
