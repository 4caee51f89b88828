"""Context trimming (context_overflow) through the gateway: a chat history
longer than the context is refused by default; truncate-left drops the
oldest turns and keeps the system prompt and the newest turns; middle-out
also keeps the first exchange; summarize puts the served model's summary of
the dropped turns in their place (made once, then reused). The kept history is checked against /tokenize
of the expected messages (the same template and tokenizer): the fewest whole
turns dropped, the prompt within the context less max_tokens, and the
policy and what was dropped in usage, streamed or not."""
import json
import urllib.request

from apiutil import GW, check, finish, post

MAXTOK = 16
st, j = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
with urllib.request.urlopen(GW + "/v1/models", timeout=10) as f:
    L = [m for m in json.loads(f.read())["data"] if "embedding_dimensions" not in m][0]["max_model_len"]
system = {"role": "system", "content": "You are a terse assistant. Answer in one short sentence."}
turns = []
for i in range(60):
    turns.append([{"role": "user", "content": "Question %d: tell me something true about the number %d, and why it "
                   "matters to people who work with numbers every day." % (i, i * 7)},
                  {"role": "assistant", "content": "Answer %d: the number %d is divisible by seven, which makes it "
                   "a multiple that appears in calendars and in many schedules." % (i, i * 7)}])
# a turn with a tool call and its result in the middle: dropped together or kept together
turns[30] = [{"role": "user", "content": "What is the weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 18}"},
             {"role": "assistant", "content": "It is 18 degrees in Paris."}]
last = {"role": "user", "content": "Which question did I ask last before this one?"}
flat = lambda ts: [m for t in ts for m in t]
history = [system] + flat(turns) + [last]


def tokens(msgs):
    st, j = post("/tokenize", {"messages": msgs})
    return j["count"] if st == 200 else None


full = tokens(history)
budget = L - MAXTOK
print("context %d, history %d tokens, budget %d" % (L, full, budget))
check(full > L, "the history is longer than the context")
st, j = post("/v1/chat/completions", {"messages": history, "max_tokens": MAXTOK})
check(st == 400 and j["error"]["code"] == "context_length_exceeded", "by default, an overlong history is refused")


def expect(policy):
    """The kept messages: the most newest turns that fit (and the first turn, middle-out)."""
    head = [system] + (turns[0] if policy == "middle-out" else [])
    rest = turns[1:] if policy == "middle-out" else turns
    for d in range(0, len(rest) + 1):
        msgs = head + flat(rest[d:]) + [last]
        n = tokens(msgs)
        if n is not None and n <= budget:
            return n, len(flat(rest[:d]))
    return None, None


for policy in ["truncate-left", "middle-out"]:
    want, dropped = expect(policy)
    st, j = post("/v1/chat/completions", {"messages": history, "max_tokens": MAXTOK, "temperature": 0,
                                          "context_overflow": policy})
    u = j.get("usage", {})
    tr = u.get("context_trimming", {})
    check(st == 200 and tr.get("policy") == policy, "%s: answered, usage names the policy" % policy)
    check(u.get("prompt_tokens") == want, "%s: the prompt is the system prompt%s and the newest turns that fit "
          "(%s tokens, expected %s)" % (policy, " and the first turn" if policy == "middle-out" else "",
                                        u.get("prompt_tokens"), want))
    check(tr.get("dropped_messages") == dropped, "%s: %s messages dropped, whole turns (expected %s)"
          % (policy, tr.get("dropped_messages"), dropped))
    check(tr.get("dropped_tokens") == full - want if want else False, "%s: dropped_tokens is what the history lost"
          % policy)
    check(u.get("prompt_tokens", L) + u.get("completion_tokens", L) <= L, "%s: never past the context" % policy)
# summarize: the dropped middle replaced by the served model's own summary, kept for the next request
for attempt in ("made", "cached"):
    st, j = post("/v1/chat/completions", {"messages": history, "max_tokens": MAXTOK, "temperature": 0,
                                          "context_overflow": "summarize"})
    u = j.get("usage", {})
    tr = u.get("context_trimming", {})
    check(st == 200 and tr.get("policy") == "summarize" and tr.get("summary_tokens", 0) > 0,
          "summarize (%s): answered with a summary of %s tokens in place of %s messages"
          % (attempt, tr.get("summary_tokens"), tr.get("dropped_messages")))
    check(tr.get("summary_cached") == (attempt == "cached"), "summarize: the summary was %s" % attempt)
    check(u.get("prompt_tokens", L) <= budget and u.get("prompt_tokens", L) + u.get("completion_tokens", L) <= L,
          "summarize: within the context (%s prompt tokens)" % u.get("prompt_tokens"))
# streamed, with usage
r = urllib.request.Request(GW + "/v1/chat/completions", json.dumps({
    "messages": history, "max_tokens": MAXTOK, "stream": True, "stream_options": {"include_usage": True},
    "context_overflow": "truncate-left"}).encode(), {"Content-Type": "application/json"})
with urllib.request.urlopen(r, timeout=120) as f:
    events = [json.loads(l[6:]) for l in f.read().decode().splitlines() if l.startswith("data: {")]
usage = [e["usage"] for e in events if e.get("usage")]
check(usage and usage[-1].get("context_trimming", {}).get("policy") == "truncate-left", "a stream's usage says so too")
# a history that fits is never touched
short = [system, turns[0][0], turns[0][1], last]
st, j = post("/v1/chat/completions", {"messages": short, "max_tokens": MAXTOK, "context_overflow": "truncate-left"})
check(st == 200 and "context_trimming" not in j["usage"] and j["usage"]["prompt_tokens"] == tokens(short),
      "a history that fits is sent whole")
# nothing left to drop
st, j = post("/v1/chat/completions", {"messages": [system, {"role": "user", "content": "word " * (L + 50)}],
                                      "max_tokens": MAXTOK, "context_overflow": "truncate-left"})
check(st == 400 and "no earlier turn" in j["error"]["message"], "one message longer than the context: still refused")
st, j = post("/v1/chat/completions", {"messages": short, "context_overflow": "sideways"})
check(st == 400 and j["error"]["param"] == "context_overflow", "an unknown policy is refused by name")
finish("test_trimming")
