"""Prompt scoring and the tokenizer endpoints through the openai client:
completions with echo + logprobs (max_tokens 0 and more) agree with
`llmserve perplexity` on the same text; token-id prompts and a batch of one;
vLLM's prompt_logprobs on completions and chat, the same when the prompt is
in the prefix cache; /tokenize, /detokenize and /tokenizer_info in vLLM's
shapes, agreeing with the completions' own token counts; refusals by name."""
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

import openai

from apiutil import GW, check, failures, model_id, post as post_status, finish as report  # noqa: E402,F401
client = openai.OpenAI(base_url=GW + "/v1", api_key="none", timeout=120, max_retries=0)
MODEL = client.models.list().data[0].id


post = post_status


TEXT = ("The quick brown fox jumps over the lazy dog. It was a sunny day in the park, "
        "and the children were playing by the old oak tree.")

# ---- the reference: llmserve perplexity on the same text ------------------
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write(TEXT)
out = subprocess.run([os.environ["LLMSERVE"], "perplexity", "--model", os.environ["MODEL"], "--file", f.name],
                     capture_output=True, text=True, timeout=300).stdout
os.unlink(f.name)
nll = float(re.search(r"nll: ([0-9.]+)", out).group(1))
scored = int(re.search(r"scored: ([0-9]+)", out).group(1))

# ---- echo + logprobs, max_tokens 0 ------------------------------------------
st, tk = post("/tokenize", {"prompt": TEXT})
check(st == 200 and tk["count"] == len(tk["tokens"]) and tk["max_model_len"] > 0, "/tokenize: count, tokens, max_model_len")
r = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=0, echo=True, logprobs=3, temperature=0)
c = r.choices[0]
lp = c.logprobs
check(c.text == TEXT and r.usage.completion_tokens == 0 and c.finish_reason == "length",
      "max_tokens 0 with echo: the prompt back, nothing generated (%r, %d tokens)" % (c.text[-12:], r.usage.completion_tokens))
check(len(lp.tokens) == tk["count"] == r.usage.prompt_tokens and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None,
      "echo logprobs: one entry per prompt token (%d), the first null" % len(lp.tokens))
total = -sum(x for x in lp.token_logprobs[1:])
check(len(lp.token_logprobs) - 1 == scored and abs(total - nll) < 1e-3 * nll,
      "echo logprobs agree with llmserve perplexity: NLL %.4f vs %.4f over %d tokens" % (total, nll, scored))
check(all(len(t) >= 1 and lp.token_logprobs[i] in t.values() for i, t in enumerate(lp.top_logprobs) if t),
      "echo top_logprobs hold the prompt's own token and its alternatives")
check(lp.text_offset[0] == 0 and all(a <= b for a, b in zip(lp.text_offset, lp.text_offset[1:])),
      "echo text_offset starts at 0 and grows")

# more tokens after the echo; the prompt as ids, and as a batch of one
r = client.completions.create(model=MODEL, prompt=[tk["tokens"]], max_tokens=4, echo=True, logprobs=1, temperature=0)
lp = r.choices[0].logprobs
check(len(lp.tokens) == tk["count"] + r.usage.completion_tokens and r.choices[0].text.startswith(TEXT) and
      abs(-sum(lp.token_logprobs[1:tk["count"]]) - nll) < 1e-3 * nll,
      "echo with 4 generated tokens on a token-id prompt (a batch of one): prompt then completion")

# ---- prompt_logprobs (vLLM) ---------------------------------------------
def prompt_lps(body):
    st, d = post("/v1/completions", body)
    return st, d["choices"][0].get("prompt_logprobs") if st == 200 else d


st, pl = prompt_lps({"prompt": TEXT, "max_tokens": 1, "prompt_logprobs": 2, "temperature": 0})
ids = tk["tokens"]
ok = st == 200 and pl[0] is None and len(pl) == len(ids)
ok = ok and all(str(ids[i]) in pl[i] and 1 <= len(pl[i]) <= 3 for i in range(1, len(ids)))
check(ok, "prompt_logprobs: null, then a map per token holding the token itself and 2 alternatives")
total = -sum(pl[i][str(ids[i])]["logprob"] for i in range(1, len(ids))) if ok else 0
check(ok and abs(total - nll) < 1e-3 * nll, "prompt_logprobs agree with llmserve perplexity (%.4f vs %.4f)" % (total, nll))
ranks_ok = ok and all(pl[i][str(ids[i])]["rank"] >= 1 and
                      all(v["rank"] <= pl[i][str(ids[i])]["rank"] for k, v in pl[i].items()
                          if v["logprob"] >= pl[i][str(ids[i])]["logprob"]) for i in range(1, len(ids)))
check(ranks_ok, "prompt_logprobs ranks: 1 for the most likely, more likely tokens rank lower")
st2, pl2 = prompt_lps({"prompt": TEXT, "max_tokens": 1, "prompt_logprobs": 2, "temperature": 0})
check(st2 == 200 and pl2 == pl, "prompt_logprobs again (the prompt is now in the prefix cache): the same values")
st, d = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2,
                                      "prompt_logprobs": 0})
st2, tc = post("/tokenize", {"messages": [{"role": "user", "content": "Hello there"}]})
check(st == 200 and st2 == 200 and d["prompt_logprobs"][0] is None and len(d["prompt_logprobs"]) == tc["count"] ==
      d["usage"]["prompt_tokens"], "chat prompt_logprobs: one per prompt token, as many as /tokenize counts for the messages")

r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4, logprobs=True,
                                   top_logprobs=2, temperature=0)
ents = r.choices[0].logprobs.content
check(ents and all(e.bytes is not None and bytes(e.bytes).decode("utf-8", "replace") == e.token and len(e.top_logprobs) == 2 and
                   all(t.bytes is not None for t in e.top_logprobs) for e in ents),
      "chat logprobs carry bytes (the token's own, and each alternative's)")

# ---- tokenizer endpoints ------------------------------------------------
st, dt = post("/detokenize", {"tokens": tk["tokens"]})
check(st == 200 and dt["prompt"] == TEXT, "/detokenize of /tokenize is the text")
st, t2 = post("/tokenize", {"prompt": "Hi", "add_special_tokens": False, "return_token_strs": True})
check(st == 200 and t2["token_strs"] and "".join(t2["token_strs"]) == "Hi", "/tokenize return_token_strs: %s" % t2.get("token_strs"))
with urllib.request.urlopen(GW + "/tokenizer_info", timeout=10) as f:
    info = json.loads(f.read())
check(info.get("eos_token") and "chat_template" in info and info.get("model_max_length", 0) > 0,
      "/tokenizer_info: eos_token %r, a chat template, model_max_length %s" % (info.get("eos_token"), info.get("model_max_length")))
st, e = post("/detokenize", {"tokens": [10 ** 9]})
check(st == 400 and e["error"]["param"] == "tokens", "/detokenize of an id outside the vocabulary: 400 naming 'tokens'")
st, e = post("/tokenize", {"prompt": "a", "messages": []})
check(st == 400, "/tokenize with both prompt and messages: 400")

# ---- batched prompts --------------------------------------------------------
PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3,"]
single = [client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0).choices[0].text for p in PROMPTS]
r = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0, n=2)
ch = sorted(r.choices, key=lambda c: c.index)
check([c.index for c in ch] == list(range(6)) and [c.text for c in ch] == [t for t in single for _ in range(2)],
      "a batch of 3 prompts x n=2: six choices, prompt-major (vLLM's order), each as its prompt alone gives")
check(r.usage.prompt_tokens == sum(post("/tokenize", {"prompt": p})[1]["count"] for p in PROMPTS) and
      6 <= r.usage.completion_tokens <= 36, "a batch's usage sums its prompts and choices (%d prompt, %d completion tokens)"
      % (r.usage.prompt_tokens, r.usage.completion_tokens))
texts, fins = {}, {}
for chunk in client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0, stream=True):
    for c in chunk.choices:
        texts[c.index] = texts.get(c.index, "") + c.text
        if c.finish_reason:
            fins[c.index] = c.finish_reason
check([texts.get(i) for i in range(3)] == single and len(fins) == 3, "a streamed batch: each index's deltas join into its text")
usage = [c.usage for c in client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=6, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}) if c.usage]
check(len(usage) == 1 and usage[0].prompt_tokens == r.usage.prompt_tokens and
      usage[0].total_tokens == usage[0].prompt_tokens + usage[0].completion_tokens and usage[0].completion_tokens >= 3,
      "a streamed batch with include_usage: one usage chunk, its prompts summed (%s)" % (usage[:1],))
ids = [post("/tokenize", {"prompt": p})[1]["tokens"] for p in PROMPTS]
r = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
check(sorted(len(c.logprobs.tokens) for c in r.choices) == sorted(len(t) for t in ids),
      "a batch of token-id prompts scored with echo: each choice carries its own prompt")
try:
    client.completions.create(model=MODEL, prompt=["ok", "x " * 5000], max_tokens=4000)
    param = "accepted"
except openai.BadRequestError as e:
    param = e.body.get("param")
check(param in ("max_tokens", "prompt"), "a batch with one prompt past the context: 400 (%s)" % param)
try:
    client.completions.create(model=MODEL, prompt=["a"] * 100, n=3, max_tokens=1)
    param = "accepted"
except openai.BadRequestError as e:
    param = e.body.get("param")
check(param == "n", "100 prompts x n=3 is past 256 choices: 400 naming n")

# ---- refusals -------------------------------------------------------------
def refused(**kw):
    try:
        client.completions.create(model=MODEL, prompt="Hi", **kw)
    except openai.BadRequestError as e:
        return e.body.get("param") if isinstance(e.body, dict) else None
    return "accepted"


check(refused(max_tokens=0) == "max_tokens", "max_tokens 0 without echo: 400 naming max_tokens")
check(refused(max_tokens=2, echo=True, logprobs=1, stream=True) == "echo", "streamed echo with logprobs: 400 naming echo")

report("scoring")
