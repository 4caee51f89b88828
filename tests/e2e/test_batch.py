"""`llmserve generate --batch` and the gateway answer the same requests the
same way: both convert a request's generation parameters through the same
converters (cm_oai_gen_params, then the wire's pr_params or straight to
wk_params_from_gen), so a field that one path honours and the other drops
shows here. Each request runs alone on both sides (--max-num-seqs 1 and one
request at a time), so the numbers are the same computation.

  test_batch.py BUILD_DIR MODEL
"""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Harness  # noqa: E402

BUILD, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
if not os.path.isfile(MODEL):
    print("model %s not found: run tools/setup.sh" % MODEL)
    sys.exit(77)
BASE = 26000 + os.getpid() % 5000
H = Harness("llmserve-batch-")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
REQS = [
    {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
    {"prompt": "A person as JSON:", "max_tokens": 40, "temperature": 0,
     "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
    {"prompt": "Answer yes or no:", "max_tokens": 3, "temperature": 0, "guided_choice": ["yes", "no"]},
    {"prompt": "The quick brown fox", "max_tokens": 0, "echo": True, "logprobs": 2},
    {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "prompt_logprobs": 1},
    {"prompt": "Count: one, two,", "max_tokens": 12, "temperature": 0, "stop": [","], "logprobs": 3},
    {"prompt": "My favourite colour is", "max_tokens": 6, "temperature": 0, "logit_bias": {"2": 100}},
    {"prompt": "In the morning I", "max_tokens": 10, "temperature": 0.9, "top_p": 0.8, "top_k": 20, "seed": 7,
     "n": 2, "presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.1},
    {"prompt": "Hello", "max_tokens": 5, "temperature": 0, "min_tokens": 4, "ignore_eos": True},
]


def post(port, body):
    r = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=120) as f:
            return json.loads(f.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def shape(resp):
    """What must agree: each choice's text, finish and logprobs (rounded), and the usage; not ids or times."""
    if "error" in resp:
        return {"error": resp["error"].get("message")}
    out = []
    for c in resp["choices"]:
        lp = c.get("logprobs")
        if lp:
            lp = {"tokens": lp.get("tokens"),
                  "token_logprobs": [None if x is None else round(x, 3) for x in lp.get("token_logprobs", [])]}
        out.append({"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"], "logprobs": lp,
                    "prompt_logprobs": c.get("prompt_logprobs") and len(c["prompt_logprobs"])})
    u = resp.get("usage", {})
    return {"choices": out, "usage": (u.get("prompt_tokens"), u.get("completion_tokens"))}


def main():
    try:
        w, g = BASE, BASE + 1
        H.start([BUILD + "/llmserve-worker", "--model", MODEL, "--listen", "tcp://127.0.0.1:%d" % w, "--threads", "2",
                 "--max-num-seqs", "1", "--kv-cache-memory", "256MiB", "--log-level", "warn"], "worker.log")
        H.start([BUILD + "/llmserve-gateway", "--port", str(g), "--workers", "tcp://127.0.0.1:%d" % w, "--log-level",
                 "warn"], "gateway.log")
        up = False
        for _ in range(300):
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % g, timeout=2) as f:
                    up = b'"workers_up":1' in f.read()
            except OSError:
                pass
            if up:
                break
            time.sleep(0.2)
        H.check(up, "a worker and a gateway are up")
        src = os.path.join(H.tmp, "batch.jsonl")
        with open(src, "w") as f:
            for r in REQS:
                f.write(json.dumps(r) + "\n")
        out = subprocess.run([BUILD + "/llmserve", "generate", "--model", MODEL, "--threads", "2", "--max-num-seqs", "1",
                              "--batch", src], capture_output=True, text=True, timeout=300)
        lines = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
        H.check(out.returncode == 0 and len(lines) == len(REQS),
                "generate --batch answers every line (%d of %d, exit %d)" % (len(lines), len(REQS), out.returncode))
        for i, r in enumerate(REQS):
            a = shape(lines[i]) if i < len(lines) else None
            b = shape(post(g, r))
            what = ", ".join(k for k in r if k not in ("prompt",))
            ok = a == b and "error" not in b
            H.check(ok, "batch == gateway for {%s}" % what)
            if not ok:
                print("   batch:   %s\n   gateway: %s" % (json.dumps(a)[:300], json.dumps(b)[:300]))
        # what the grammar asked for is there on both paths
        txt = lines[1]["choices"][0]["text"] if len(lines) > 1 and "choices" in lines[1] else ""
        try:
            obj = json.loads(txt)
        except ValueError:
            obj = None
        H.check(isinstance(obj, dict) and set(obj) == {"name", "age"},
                "generate --batch honours response_format's schema: %r" % txt[:60])
    finally:
        rc = H.finish("batch e2e")
    return rc


sys.exit(main())
