"""/v1/embeddings through the openai client (base64 by default, float on
request) and plain HTTP: every vector against the independent reference
(tests/ref/bert_ref.py's golden file: Hugging Face tokenizers + numpy), the
usage against the reference's token counts, token-id inputs, batches in
order, 16 clients at once, and the refusals by name. With the argument
`langchain`: langchain-openai's OpenAIEmbeddings (its own tiktoken
pre-tokenizing turned off: token ids of another vocabulary mean nothing to
this model)."""
import json
import math
import os
import sys
import threading
import urllib.request

from apiutil import GW, check, finish, post

import openai

golden = json.load(open(os.environ["GOLDEN"]))
cases = [c for c in golden["cases"] if c["text"]]
client = openai.OpenAI(base_url=GW + "/v1", api_key="none")
with urllib.request.urlopen(GW + "/v1/models", timeout=10) as f:
    models = json.loads(f.read())["data"]
emb = [m for m in models if "embedding_dimensions" in m]
chat = [m for m in models if "embedding_dimensions" not in m]
EMB = emb[0]["id"] if emb else None


def cos(a, b):
    ab = sum(x * y for x, y in zip(a, b))
    return ab / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def worst(got, want):
    return min(cos(g, w) for g, w in zip(got, want)) if len(got) == len(want) and got else -1


if len(sys.argv) > 1 and sys.argv[1] == "langchain":
    from langchain_openai import OpenAIEmbeddings
    e = OpenAIEmbeddings(model=EMB, base_url=GW + "/v1", api_key="none", check_embedding_ctx_length=False)
    docs = [c["text"] for c in cases[:5]]
    got = e.embed_documents(docs)
    check(worst(got, [c["embedding"] for c in cases[:5]]) >= 0.99999, "langchain embed_documents matches the reference")
    q = e.embed_query(cases[1]["text"])
    check(cos(q, cases[1]["embedding"]) >= 0.99999, "langchain embed_query matches the reference")
    finish("test_embeddings (langchain)")

check(len(emb) == 1 and emb[0]["embedding_dimensions"] == 384 and emb[0]["max_model_len"] == 256,
      "/v1/models lists the embedding model with its width and input length")
check(len(chat) == 1, "/v1/models lists the chat model beside it")

# the openai client: base64 on the wire (its default), one input, then all of them
r = client.embeddings.create(model=EMB, input=cases[0]["text"])
check(len(r.data) == 1 and len(r.data[0].embedding) == 384, "one input: one vector of 384")
check(cos(r.data[0].embedding, cases[0]["embedding"]) >= 0.99999, "base64 vector matches the reference")
check(r.usage.prompt_tokens == len(cases[0]["ids"]) == r.usage.total_tokens, "usage counts the reference's tokens")
check(r.model == EMB, "the response names the model")
texts = [c["text"] for c in cases]
r = client.embeddings.create(model=EMB, input=texts)
check([d.index for d in r.data] == list(range(len(texts))), "a list of %d inputs answers in order" % len(texts))
check(worst([d.embedding for d in r.data], [c["embedding"] for c in cases]) >= 0.99999,
      "every input matches the reference (cosine >= 0.99999)")
check(r.usage.prompt_tokens == sum(len(c["ids"]) for c in cases), "usage sums the inputs' tokens")
rf = client.embeddings.create(model=EMB, input=texts[:3], encoding_format="float")
check(worst([d.embedding for d in rf.data], [d.embedding for d in r.data[:3]]) > 0.9999999,
      "encoding_format float gives the same vectors")
# token ids, as given (the [CLS] ... [SEP] the tokenizer would add are the caller's)
r = client.embeddings.create(model=EMB, input=[cases[1]["ids"], cases[2]["ids"]])
check(worst([d.embedding for d in r.data], [cases[1]["embedding"], cases[2]["embedding"]]) >= 0.99999,
      "token-id inputs match the reference")
st, j = post("/v1/embeddings", {"input": cases[3]["ids"], "model": EMB})
check(st == 200 and cos(j["data"][0]["embedding"], cases[3]["embedding"]) >= 0.99999, "one flat list of token ids")
st, j = post("/v1/embeddings", {"input": "no model named"})
check(st == 200 and j["model"] == EMB, "model may be left out")

# 16 clients at once: batched together on the worker, each answer its own
res = [None] * 16


def one(i):
    c = cases[i % len(cases)]
    try:
        d = client.embeddings.create(model=EMB, input=[c["text"], cases[(i + 1) % len(cases)]["text"]]).data
        res[i] = cos(d[0].embedding, c["embedding"]) >= 0.99999 and \
            cos(d[1].embedding, cases[(i + 1) % len(cases)]["embedding"]) >= 0.99999
    except Exception as ex:  # noqa: BLE001 - a failure is a result here
        print("client %d: %s" % (i, ex))
        res[i] = False


ts = [threading.Thread(target=one, args=(i,)) for i in range(16)]
[t.start() for t in ts]
[t.join() for t in ts]
check(all(res), "16 concurrent clients each get their own vectors")


# refusals, by name
def refused(body, status, param=None, code=None, what=""):
    st, j = post("/v1/embeddings", body)
    err = j.get("error", {})
    ok = st == status and (param is None or err.get("param") == param) and (code is None or err.get("code") == code)
    check(ok, "%s: %d %s" % (what, st, err.get("message", "")[:90]))


refused({"input": "word " * 300, "model": EMB}, 400, "input", "context_length_exceeded", "an input over 256 tokens")
refused({"input": [list(range(1000, 1300))], "model": EMB}, 400, "input", "context_length_exceeded", "ids over 256")
refused({"input": [[101, 99999, 102]]}, 400, "input", None, "a token id outside the vocabulary")
refused({"input": "x", "dimensions": 128}, 400, "dimensions", None, "dimensions other than 384")
refused({"input": "x", "encoding_format": "int8"}, 400, "encoding_format", None, "an unknown encoding_format")
refused({"input": "x", "truncate": True}, 400, None, None, "an unknown field")
refused({"input": ""}, 400, "input", None, "an empty string")
refused({"input": []}, 400, "input", None, "an empty list")
refused({"input": ["x"] * 2049}, 400, "input", None, "2049 inputs")
refused({"input": [1.5]}, 400, "input", None, "a float where token ids go")
refused({}, 400, "input", None, "no input")
refused({"input": "x", "model": "nope"}, 404, "model", "model_not_found", "an unknown model")
if chat:
    refused({"input": "x", "model": chat[0]["id"]}, 400, "model", None, "the chat model")
    st, j = post("/v1/chat/completions", {"model": EMB, "messages": [{"role": "user", "content": "hi"}]})
    check(st == 400 and "embedding model" in j["error"]["message"], "chat with the embedding model is refused by name")
st, j = post("/v1/embeddings", {"input": "dimensions equal to the width are fine", "dimensions": 384})
check(st == 200, "dimensions 384 accepted")
try:
    client.embeddings.create(model=EMB, input="x", dimensions=64)
    check(False, "the openai client sees the dimensions refusal")
except openai.BadRequestError as ex:
    check("dimensions" in str(ex), "the openai client sees the dimensions refusal")
finish("test_embeddings")
