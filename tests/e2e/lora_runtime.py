#!/usr/bin/env python3
"""lora_e2e's run-time part: adapters loaded and unloaded while serving, as
vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter.

    lora_runtime.py GATEWAY_URL OTHER_GATEWAY_URL MERGED_A_URL MERGED_B_URL DIR BASE_NAME

GATEWAY_URL fronts two worker groups started with --enable-lora --max-loras 2
and no adapters, one of them two pipeline stages of 2 tensor-parallel ranks;
OTHER_GATEWAY_URL fronts that one alone (so every answer through it is the
staged group's). DIR holds lora-a and lora-b. Checked: a load answers
vLLM's success text and the adapter then gives the merged model's tokens and
log-probabilities on both gateways (the other learns of it from the groups'
Health); loading a name twice, a missing directory, a third adapter past
--max-loras, an unknown field and a served model's name are refused; an
unload ends new requests (404) while a stream already running finishes
whole; a name loaded again with other weights computes with them (none of
the old adapter's K/V reused); a GGUF LoRA file loads at run time too."""
import json
import sys
import threading
import time
import urllib.error
import urllib.request

GW, GW2, MA, MB, DIR, BASE = sys.argv[1:7]
LONG = ("A long shared instruction that every request in this test starts with, so that its first blocks are "
        "cached: answer briefly, answer politely, answer in English, and never repeat the question. Question:")
PROMPTS = ["The capital of France is", LONG]
fails = 0


def check(ok, what):
    global fails
    print(("ok   " if ok else "FAIL ") + what)
    fails += 0 if ok else 1


def call(url, path, body=None, method=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read().decode()
            return r.status, raw
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def load(name, path, url=GW):
    return call(url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})


def unload(name, url=GW):
    return call(url, "/v1/unload_lora_adapter", {"lora_name": name})


def run(url, model, prompt, n=8):
    st, raw = call(url, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
                                            "logprobs": 3, "ignore_eos": True})
    if st != 200:
        return st, raw
    c = json.loads(raw)["choices"][0]
    return st, {"tokens": c["logprobs"]["tokens"], "top": c["logprobs"]["top_logprobs"]}


def same(a, b, tol=1e-3):
    if not isinstance(a, dict) or not isinstance(b, dict) or a["tokens"] != b["tokens"]:
        return False
    return all(set(x) == set(y) and all(abs(x[k] - y[k]) <= tol for k in x) for x, y in zip(a["top"], b["top"]))


def models(url):
    return {m["id"] for m in json.loads(call(url, "/v1/models")[1])["data"]}


def err(raw):
    try:
        return json.loads(raw)["error"]["message"]
    except Exception:  # noqa: BLE001 - the raw text then
        return raw


merged = {(m, p): run(url, None, p)[1] for m, url in (("a", MA), ("b", MB)) for p in PROMPTS}
base = {p: run(GW, BASE, p)[1] for p in PROMPTS}
check(models(GW) == {BASE}, "no adapter before a load: /v1/models %s" % sorted(models(GW)))
st, raw = run(GW, "a", PROMPTS[0])
check(st == 404, "a request for adapter a before its load: %d" % st)

st, raw = load("a", DIR + "/lora-a")
check(st == 200 and raw == "Success: LoRA adapter 'a' added successfully.", "load a: %d %r" % (st, raw))
check("a" in models(GW), "/v1/models lists a after its load")
for p in PROMPTS:
    for _ in range(2):  # two groups behind the gateway: each may answer
        st, r = run(GW, "a", p)
        check(same(r, merged[("a", p)]), "a loaded at run time == merged weights on %r" % p[:24])
t0 = time.time()
while "a" not in models(GW2) and time.time() - t0 < 10:
    time.sleep(0.2)
check("a" in models(GW2), "the other gateway lists a after %.1f s (from the group's Health)" % (time.time() - t0))
for p in PROMPTS:
    st, r = run(GW2, "a", p)
    check(same(r, merged[("a", p)]), "a on the TP group (both ranks loaded it) == merged weights on %r" % p[:24])

st, raw = load("a", DIR + "/lora-b")
check(st == 400 and "already been loaded" in err(raw), "a name loaded twice is refused: %d %s" % (st, err(raw)[:120]))
st, raw = load("c", DIR + "/no-such-adapter")
check(st == 400 and "no-such-adapter" in err(raw) and "c" not in models(GW),
      "a missing directory is refused, naming it: %d %s" % (st, err(raw)[:160]))
st, raw = load("b", DIR + "/lora-b")
check(st == 200, "load b: %d" % st)
st, raw = load("c", DIR + "/lora-a")
check(st == 400 and "--max-loras" in err(raw), "a third adapter past --max-loras 2 is refused: %s" % err(raw)[:120])
st, raw = call(GW, "/v1/load_lora_adapter", {"lora_name": "d", "lora_path": DIR + "/lora-a", "base_model_name": "x"})
check(st == 400 and "base_model_name" in err(raw), "an unknown field is refused by name: %s" % err(raw)[:100])
st, raw = load(BASE, DIR + "/lora-a")
check(st == 400 and "served model" in err(raw), "a served model's name is refused: %s" % err(raw)[:100])
st, raw = call(GW, "/v1/load_lora_adapter", method="GET")
check(st == 405, "GET /v1/load_lora_adapter: %d" % st)

# an unload while b streams: the stream finishes whole; new requests for b are 404
out = {}


def stream():
    req = urllib.request.Request(GW + "/v1/completions", json.dumps(
        {"model": "b", "prompt": LONG, "max_tokens": 48, "temperature": 0, "ignore_eos": True, "stream": True}).encode(),
        {"Content-Type": "application/json"})
    n, done = 0, False
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                n += sum(1 for c in json.loads(line[6:]).get("choices", []) if c.get("text"))
    out["n"], out["done"] = n, done


th = threading.Thread(target=stream)
th.start()
time.sleep(0.3)
st, raw = unload("b")
check(st == 200 and raw == "Success: LoRA adapter 'b' removed successfully.", "unload b while it streams: %d %r" % (st, raw))
th.join()
check(out.get("done") and out.get("n", 0) >= 40, "the stream running at the unload finished whole (%s)" % out)
check("b" not in models(GW), "/v1/models no longer lists b")
st, raw = run(GW, "b", PROMPTS[0])
check(st == 404, "a request for b after its unload: %d" % st)
st, raw = unload("b")
check(st == 404, "unloading b again: %d %s" % (st, err(raw)[:80]))

# the name a again, now with b's weights: computed with them, none of the old a's K/V (LONG is cached under a)
check(unload("a")[0] == 200, "unload a")
st, raw = load("a", DIR + "/lora-b")
check(st == 200, "load a again from lora-b: %d" % st)
t0 = time.time()
while "a" not in models(GW2) and time.time() - t0 < 10:
    time.sleep(0.2)
for p in PROMPTS:
    for url in (GW, GW2):
        st, r = run(url, "a", p)
        check(same(r, merged[("b", p)]), "the new a == b's merged weights on %r%s (no old K/V)" %
              (p[:24], " on the TP group" if url == GW2 else ""))
st, raw = load("g", DIR + "/lora-a.gguf")
check(st == 200, "load g from a GGUF LoRA file: %d %s" % (st, err(raw)[:100]))
t0 = time.time()
while "g" not in models(GW2) and time.time() - t0 < 10:  # the other gateway hears of it from the group's Health
    time.sleep(0.2)
for url in (GW, GW2):
    st, r = run(url, "g", PROMPTS[0])
    check(same(r, merged[("a", PROMPTS[0])]), "the GGUF LoRA loaded at run time == a's merged weights%s" %
          (" on the TP group" if url == GW2 else ""))
st, r = run(GW, BASE, LONG)
check(same(r, base[LONG]), "the base model's answer is its own after all that")
print("lora runtime: %d failed" % fails)
sys.exit(1 if fails else 0)
