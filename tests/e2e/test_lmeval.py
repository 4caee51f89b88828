"""lm-evaluation-harness against the gateway: `lm-eval --model
local-completions` with the remote tokenizer (our /tokenize, /detokenize,
/tokenizer_info) on two small tasks of our own (tests/e2e/lmeval): one
loglikelihood (multiple choice), one generate_until, in batches of 4
prompts per request. Every loglikelihood
lm-eval records must equal the one our /v1/completions echo gives for the
same tokens, and every generation the one a direct greedy request gives."""
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

from apiutil import GW, check, failures, model_id, post as post_status, finish as report  # noqa: E402,F401
LMEVAL = os.environ["LMEVAL"]
HERE = os.path.dirname(os.path.abspath(__file__))


def post(path, body):
    return post_status(path, body)[1]


with urllib.request.urlopen(GW + "/v1/models", timeout=10) as f:
    MODEL = json.loads(f.read())["data"][0]["id"]

tmp = tempfile.mkdtemp(prefix="llmserve-lmeval-")
tasks = {
    "llmserve_mc": """task: llmserve_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: %s/lmeval/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
target_delimiter: ""
metric_list:
  - metric: acc
""" % HERE,
    "llmserve_gen": """task: llmserve_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: %s/lmeval/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
target_delimiter: ""
generation_kwargs:
  until: ["\\n", "Q:"]
  max_gen_toks: 16
  do_sample: false
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
""" % HERE}
for name, text in tasks.items():
    with open(os.path.join(tmp, name + ".yaml"), "w") as f:
        f.write(text)
env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
args = [LMEVAL, "run", "--model", "local-completions", "--model_args",
        "model=%s,base_url=%s/v1/completions,tokenizer_backend=remote,tokenized_requests=True,num_concurrent=1,"
        "max_retries=1,timeout=120" % (MODEL, GW),
        "--tasks", "llmserve_mc,llmserve_gen", "--include_path", tmp, "--output_path", os.path.join(tmp, "out"),
        "--log_samples", "--batch_size", "4"]  # batches of 4: lists of prompts
p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
if p.returncode:
    args.remove("run")  # older lm-eval has no subcommands
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
print(p.stdout[-3000:])
check(p.returncode == 0, "lm-eval ran both tasks (exit %d)%s" % (p.returncode, "" if not p.returncode else ": " + p.stderr[-1500:]))
results, samples = None, {}
for root, _, files in os.walk(os.path.join(tmp, "out")):
    for fn in files:
        path = os.path.join(root, fn)
        if fn.startswith("results") and fn.endswith(".json"):
            results = json.load(open(path))
        elif fn.startswith("samples_") and fn.endswith(".jsonl"):
            task = fn[len("samples_"):].rsplit("_", 1)[0]
            samples[task] = [json.loads(line) for line in open(path)]
check(results is not None and "acc,none" in results["results"].get("llmserve_mc", {}) and
      "exact_match,none" in results["results"].get("llmserve_gen", {}),
      "lm-eval reports acc for the loglikelihood task and exact_match for the generate task: %s" %
      (json.dumps({k: {m: v for m, v in r.items() if "," in m} for k, r in results["results"].items()}) if results else None))

# ---- the loglikelihoods are ours, token for token ------------------------------
def loglikelihood(context, continuation):
    ctx = post("/tokenize", {"prompt": context, "add_special_tokens": False})["tokens"]
    cont = post("/tokenize", {"prompt": continuation, "add_special_tokens": False})["tokens"]
    r = post("/v1/completions", {"model": MODEL, "prompt": [ctx + cont], "max_tokens": 0, "echo": True, "logprobs": 1,
                                 "temperature": 0})
    lps = r["choices"][0]["logprobs"]["token_logprobs"]
    return sum(lps[len(ctx):])


def args_of(s):  # {"gen_args_0": {"arg_0": ..., "arg_1": ...}, ...} in lm-eval 0.4.x; lists in older ones
    a = s["arguments"]
    return [(v["arg_0"], v["arg_1"]) for _, v in sorted(a.items())] if isinstance(a, dict) else [tuple(x) for x in a]


worst, n = 0.0, 0
for s in samples.get("llmserve_mc", []):
    for (ctx, cont), resp in zip(args_of(s), s["resps"]):
        worst = max(worst, abs(loglikelihood(ctx, cont) - float(resp[0][0])))
        n += 1
check(n == 24 and worst < 1e-3, "lm-eval's %d loglikelihoods equal our echo logprobs (worst difference %.2g)" % (n, worst))
gen = samples.get("llmserve_gen", [])
same = 0
for s in gen:
    ctx = args_of(s)[0][0]
    r = post("/v1/completions", {"model": MODEL, "prompt": ctx, "max_tokens": 16, "temperature": 0, "stop": ["\n", "Q:"]})
    same += r["choices"][0]["text"] == s["resps"][0][0]
check(len(gen) == 4 and same == 4, "lm-eval's generations equal direct greedy requests (%d of %d)" % (same, len(gen)))
report("lmeval")
