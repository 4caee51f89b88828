#!/usr/bin/env python3
"""lora_e2e's client: LoRA adapters served at run time against the same
adapters merged into the weights offline, alone and batched together.

    lora_check.py LORA_URL MERGED_A_URL MERGED_B_URL BASE_NAME [OTHER_LORA_URL...]

LORA_URL serves the base model with adapters a and b; MERGED_*_URL serve the
merged models. Checked: /v1/models lists a and b with the base as parent;
each adapter's greedy tokens and top-3 log-probabilities equal the merged
model's (1e-3), and differ from the base model's; twelve requests of a, b and
the base at once give what each gave alone; the same adapters as GGUF LoRA
files (ga, gb), where a URL serves them, give the PEFT ones' answers; a LoRA request for a name the
worker does not serve is a 404; vllm:lora_requests_info names the adapters.
"""
import json
import sys
import threading
import urllib.error
import urllib.request

LORA, MA, MB, BASE = sys.argv[1:5]
OTHER = sys.argv[5:]
PROMPTS = ["The capital of France is", "Once upon a time, in a small village", "def add(a, b):\n    return",
           # past two KV blocks: what the prefix cache would share if it did not key the adapter
           "A long shared instruction that every request in this test starts with, so that its first blocks are "
           "cached: answer briefly, answer politely, answer in English, and never repeat the question. Question:"]
fails = 0


def post(url, body):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def run(url, model, prompt):
    st, j = post(url, {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 3,
                       "ignore_eos": True})
    if st != 200:
        raise SystemExit("FAIL: %s %s: %s %s" % (url, model, st, j))
    c = j["choices"][0]
    return {"model": j["model"], "text": c["text"], "tokens": c["logprobs"]["tokens"],
            "top": c["logprobs"]["top_logprobs"]}


def same(a, b, tol=1e-3):
    if a["tokens"] != b["tokens"]:
        return False
    for x, y in zip(a["top"], b["top"]):
        if set(x) != set(y) or any(abs(x[k] - y[k]) > tol for k in x):
            return False
    return True


def check(ok, what):
    global fails
    print(("ok   " if ok else "FAIL ") + what)
    fails += 0 if ok else 1


models = json.load(urllib.request.urlopen(LORA + "/v1/models"))["data"]
byid = {m["id"]: m for m in models}
check(all(n in byid and byid[n].get("parent") == BASE for n in ("a", "b")) and BASE in byid,
      "/v1/models lists the adapters a and b with parent %s" % BASE)
alone = {}
for p in PROMPTS:
    for m in (BASE, "a", "b"):  # the base model first: computed before any adapter could leave K/V behind
        alone[(m, p)] = run(LORA, m, p)
for p in PROMPTS:
    for m, url in (("a", MA), ("b", MB)):
        merged = run(url, None, p)
        check(same(alone[(m, p)], merged) and alone[(m, p)]["model"] == m,
              "adapter %s == merged weights on %r: %r" % (m, p[:24], alone[(m, p)]["text"]))
        for o in OTHER:
            check(same(run(o, m, p), merged), "adapter %s on %s == merged on %r" % (m, o, p[:24]))
    for o in OTHER:  # after the adapters, with their prompt's blocks cached: the base model's own answer
        check(same(run(o, BASE, p), alone[(BASE, p)]), "the base model after the adapters on %r: its own K/V" % p[:24])
    check(not same(alone[("a", p)], alone[(BASE, p)]) and not same(alone[("b", p)], alone[(BASE, p)]),
          "the adapters change the base model's answer to %r" % p[:24])
for p in PROMPTS:  # the same adapters as GGUF LoRA files (ga, gb), where a URL serves them
    for url in [LORA] + OTHER:
        served = {m["id"] for m in json.load(urllib.request.urlopen(url + "/v1/models"))["data"]}
        for g, m in (("ga", "a"), ("gb", "b")):
            if g in served:
                check(same(run(url, g, p), alone[(m, p)]), "GGUF LoRA %s on %s == PEFT %s on %r" % (g, url, m, p[:24]))
res = {}


def worker(m, p):
    res[(m, p)] = run(LORA, m, p)


ts = [threading.Thread(target=worker, args=(m, p)) for p in PROMPTS for m in ("a", BASE, "b")]
for t in ts:
    t.start()
for t in ts:
    t.join()
check(all(same(res[k], alone[k]) for k in alone), "%d requests of a, b and the base at once == each alone" % len(ts))
st, j = post(LORA, {"model": "c", "prompt": "x", "max_tokens": 2})
check(st == 404 and j["error"]["code"] == "model_not_found", "an adapter not served is a 404 model_not_found")
met = urllib.request.urlopen(LORA + "/metrics").read().decode()
line = [l for l in met.splitlines() if l.startswith("vllm:lora_requests_info{")]
check(line and 'max_lora="8"' in line[0], "vllm:lora_requests_info, max_lora the --max-loras slots (8): %s" % (line[0] if line else "missing"))
print("lora check: %d failed" % fails)
sys.exit(1 if fails else 0)
