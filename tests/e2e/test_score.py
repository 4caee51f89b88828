"""vLLM's /v1/score and /v1/rerank (Cohere's and Jina's shapes) over the
embedding model: every score equals the cosine of the two texts' vectors as
/v1/embeddings returns them; the pairings (one against one, one against a
list, two lists item by item); rerank's order, top_n, return_documents and
Jina's {"text": ...} documents; the paths vLLM also answers (/score,
/rerank, /v2/rerank); the refusals by name. With the `cohere` SDK when it
installs (its v2 rerank against this server)."""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apiutil import check, finish, post  # noqa: E402

import urllib.request  # noqa: E402
import json  # noqa: E402

from apiutil import GW  # noqa: E402

with urllib.request.urlopen(GW + "/v1/models", timeout=10) as f:
    models = json.loads(f.read())["data"]
EMB = [m for m in models if "embedding_dimensions" in m][0]["id"]
CHAT = [m for m in models if "embedding_dimensions" not in m]


def vec(texts):
    st, j = post("/v1/embeddings", {"model": EMB, "input": texts, "encoding_format": "float"})
    return [d["embedding"] for d in j["data"]]


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


Q = "What is the capital of France?"
DOCS = ["The cat sat on the mat.", "Paris is the capital of France.", "Berlin is the capital of Germany.",
        "France is a country in Europe."]
V = vec([Q] + DOCS)
want = [cos(V[0], v) for v in V[1:]]

st, j = post("/v1/score", {"model": EMB, "text_1": Q, "text_2": DOCS})
got = [d["score"] for d in j.get("data", [])]
check(st == 200 and j["object"] == "list" and [d["index"] for d in j["data"]] == [0, 1, 2, 3]
      and all(d["object"] == "score" for d in j["data"]) and j["usage"]["prompt_tokens"] > 0
      and max(abs(a - b) for a, b in zip(got, want)) < 1e-5,
      "score, one against a list: the cosines of /v1/embeddings' vectors (%s)" % ["%.4f" % x for x in got])
st, j = post("/score", {"model": EMB, "text_1": [Q, DOCS[0]], "text_2": [DOCS[1], DOCS[2]]})
pw = [cos(V[0], V[2]), cos(V[1], V[3])]
check(st == 200 and max(abs(d["score"] - w) for d, w in zip(j["data"], pw)) < 1e-5,
      "score, two lists item by item (/score as vLLM also answers it)")
st, j = post("/v1/score", {"model": EMB, "text_1": Q, "text_2": Q})
check(st == 200 and abs(j["data"][0]["score"] - 1) < 1e-5, "a text against itself: 1")

order = sorted(range(len(DOCS)), key=lambda i: -want[i])
st, j = post("/v1/rerank", {"model": EMB, "query": Q, "documents": DOCS})
res = j.get("results", [])
check(st == 200 and [r["index"] for r in res] == order and res[0]["index"] == 1
      and all(abs(r["relevance_score"] - want[r["index"]]) < 1e-5 and r["document"]["text"] == DOCS[r["index"]]
              for r in res) and j["usage"]["total_tokens"] > 0,
      "rerank: the documents by relevance, the capital of France first (%s)" % [r["index"] for r in res])
st, j = post("/v2/rerank", {"model": EMB, "query": Q, "documents": [{"text": d} for d in DOCS], "top_n": 2,
                            "return_documents": False})
check(st == 200 and [r["index"] for r in j["results"]] == order[:2] and all("document" not in r for r in j["results"]),
      "rerank: top_n 2, return_documents false, Jina's {text} documents (/v2/rerank)")
st, j = post("/rerank", {"model": EMB, "query": Q, "documents": DOCS, "top_n": 99})
check(st == 200 and len(j["results"]) == len(DOCS), "rerank: top_n past the documents gives them all (/rerank)")

for path, body, param in (("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
                          ("/v1/score", {"text_1": "a"}, "text_2"),
                          ("/v1/score", {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 5}, None),
                          ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
                          ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
                          ("/v1/rerank", {"documents": ["a"]}, "query")):
    st, j = post(path, dict(body, model=EMB))
    e = j.get("error", {})
    check(st == 400 and e.get("param") == param, "%s refused by name: %s (%s)" % (path, param or "an unknown field",
                                                                                  e.get("message", "")[:70]))
if CHAT:
    st, j = post("/v1/score", {"model": CHAT[0]["id"], "text_1": "a", "text_2": "b"})
    check(st == 400 and j["error"]["param"] == "model", "score with the chat model: refused by name")

try:
    import cohere
except ImportError:
    cohere = None
    print("skip cohere: the SDK is not installed")
if cohere:
    co = cohere.ClientV2(api_key="none", base_url=GW)
    r = co.rerank(model=EMB, query=Q, documents=DOCS, top_n=3)
    check([x.index for x in r.results] == order[:3]
          and all(abs(x.relevance_score - want[x.index]) < 1e-5 for x in r.results),
          "the cohere SDK's v2 rerank: the same order and scores")
finish("test_score")
