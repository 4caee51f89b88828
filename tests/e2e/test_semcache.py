"""--semantic-cache end to end, through real HTTP: exact repeats (the last
user turn normalised), rewordings above the threshold, near misses below it,
isolation between API keys, never for sampled requests, never across other
parameters, tools, schemas or earlier messages, streamed hits, the TTL, the
size bound, and the metrics. The server runs with two API keys, a 4 s TTL
and room for 6 answers (run_embed_e2e.sh)."""
import json
import math
import time
import urllib.request

from apiutil import GW, check, finish

K1, K2 = "key-one", "key-two"


def call(path, body, key=K1):
    r = urllib.request.Request(GW + path, json.dumps(body).encode(),
                               {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(r, timeout=120) as f:
            return f.status, f.read().decode(), {k.lower(): v for k, v in f.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}


def chat(text, key=K1, history=(), **kw):
    body = {"messages": list(history) + [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0}
    body.update(kw)
    st, b, h = call("/v1/chat/completions", body, key)
    if kw.get("stream"):
        content = "".join(json.loads(l[6:])["choices"][0]["delta"].get("content") or "" for l in b.splitlines()
                          if l.startswith("data: {") and json.loads(l[6:])["choices"])
        return st, content, h, None
    j = json.loads(b)
    return st, j["choices"][0]["message"]["content"] if st == 200 else None, h, j


def metrics():
    with urllib.request.urlopen(GW + "/metrics", timeout=10) as f:
        m = {}
        for l in f.read().decode().splitlines():
            if l.startswith("llmserve:semantic_cache"):
                k, v = l.rsplit(" ", 1)
                m[k] = float(v)
        return m


def embed(texts):
    st, b, _ = call("/v1/embeddings", {"input": texts, "encoding_format": "float"})
    return [d["embedding"] for d in json.loads(b)["data"]]


def cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


# exact repeats
st, a, h, j = chat("What is the capital of France?")
check(st == 200 and "x-llmserve-cache" not in h, "first ask: a miss, answered by the model")
st, b, h, j2 = chat("  what is the CAPITAL of   France?")
check(h.get("x-llmserve-cache") == "exact" and b == a, "a repeat with other case and spaces: an exact hit, same answer")
check(j2["usage"]["prompt_tokens_details"]["cached_tokens"] == j2["usage"]["prompt_tokens"],
      "a hit reports every prompt token cached")
# a rewording above the threshold, and a near miss below it
para = ("Which city is the capital of France?", "What is the capital of France?")
near = "What is the capital of Germany?"
e = embed([para[0], para[1], near])
print("similarity: rewording %.3f, different question %.3f" % (cos(e[0], e[1]), cos(e[2], e[1])))
st, c, h, _ = chat(para[0])
if cos(e[0], e[1]) >= 0.90:
    check(h.get("x-llmserve-cache") == "semantic" and c == a and float(h["x-llmserve-cache-similarity"]) >= 0.90,
          "a rewording above the threshold: a semantic hit with its similarity")
st, c, h, _ = chat(near)
check("x-llmserve-cache" not in h, "a different question (similarity %.3f): answered by the model" % cos(e[2], e[1]))
# tenants
st, c, h, _ = chat("What is the capital of France?", key=K2)
check("x-llmserve-cache" not in h, "another API key never gets the first key's answer")
st, c, h, _ = chat("What is the capital of France?", key=K2)
check(h.get("x-llmserve-cache") == "exact", "the second key's own answer is reused for it")
# sampled requests, other parameters, other context
chat("Name a primary color.", temperature=0.8)
st, c, h, _ = chat("Name a primary color.", temperature=0.8)
check("x-llmserve-cache" not in h, "temperature > 0: never from the cache")
st, c, h, _ = chat("What is the capital of France?", max_tokens=6)
check("x-llmserve-cache" not in h, "another max_tokens: not the same request")
st, c, h, _ = chat("What is the capital of France?", history=[{"role": "system", "content": "Answer in French."}])
check("x-llmserve-cache" not in h, "another system prompt: not the same context")
# tools and structured outputs: only with the same schema
tool = lambda name: [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}}]
chat("Weather in Paris?", tools=tool("get_weather"))
st, c, h, _ = chat("Weather in Paris?", tools=tool("get_forecast"))
check("x-llmserve-cache" not in h, "other tools: never the answer made under the first ones")
st, c, h, _ = chat("Weather in Paris?", tools=tool("get_weather"))
check(h.get("x-llmserve-cache") == "exact", "the same tools: reused")
schema = lambda p: {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
    p: {"type": "string"}}, "required": [p]}}}
chat("Give me a name.", response_format=schema("name"))
st, c, h, _ = chat("Give me a name.", response_format=schema("title"))
check("x-llmserve-cache" not in h, "another response_format schema: never the first one's answer")
# streams
st, s1, h, _ = chat("Count to three.", stream=True)
st, s2, h, _ = chat("Count to three.", stream=True)
check(h.get("x-llmserve-cache") == "exact" and s1 == s2 and s2, "a streamed answer is stored and streamed back")
st, s3, h, _ = chat("Count to three.")
check(s3 == s1, "the same answer, streamed or not")
m = metrics()
check(m.get('llmserve:semantic_cache_hits_total{kind="exact"}', 0) >= 4, "metrics count exact hits")
check(m.get("llmserve:semantic_cache_misses_total", 0) >= 5, "metrics count misses")
check(m.get("llmserve:semantic_cache_saved_completion_tokens_total", 0) > 0, "metrics count the tokens saved")
# the size bound (6 answers), then the TTL (4 s)
for i in range(8):
    chat("Spell the number %d." % i)
m = metrics()
check(m.get("llmserve:semantic_cache_entries", 99) <= 6 and m.get("llmserve:semantic_cache_evictions_total", 0) >= 2,
      "never more than --semantic-cache-size answers (%s kept)" % m.get("llmserve:semantic_cache_entries"))
st, c, h, _ = chat("Spell the number 7.")
check(h.get("x-llmserve-cache") == "exact", "the newest answer is still there")
time.sleep(4.5)
st, c, h, _ = chat("Spell the number 7.")
check("x-llmserve-cache" not in h, "past --semantic-cache-ttl: asked again")
# every request over (the cache's questions to the embedding group too): no group counts one in flight
with urllib.request.urlopen(GW + "/metrics", timeout=10) as f:
    infl = [float(l.rsplit(" ", 1)[1]) for l in f.read().decode().splitlines() if l.startswith("llmserve:gateway_inflight{")]
check(infl and not any(infl), "nothing left in flight on any group: %s" % infl)
finish("test_semcache")
