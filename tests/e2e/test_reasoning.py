"""--reasoning-parser qwen3 against a real gateway and worker (the default
model's ChatML template, as Qwen3's): a reply without think tags is all
content; chat_template_kwargs.enable_thinking false puts Qwen3's empty think
block after the generation prompt (read back through /tokenize and
/detokenize); structured output with the reasoning on is refused by name, and
runs once thinking is off; unknown template switches are refused. Where the
splitting itself is checked: gateway_test (every chunking of think-tagged
replies) and arch_e2e (harmony, end to end); structured output with the
reasoning on holds the answer after the think block to the grammar
(cm_grammar_after; its think automaton in grammar_test), and so are forced
tool calls, read from the content after the reasoning. GW: a gateway started with
--reasoning-parser qwen3."""
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apiutil import GW, check, finish, model_id, post  # noqa: E402

M = model_id()


def post_stream(path, body):
    """(status, the content deltas joined) of a streamed chat request."""
    r = urllib.request.Request(GW + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    out = ""
    with urllib.request.urlopen(r, timeout=120) as f:
        for line in f.read().decode().splitlines():
            if line.startswith("data: {"):
                ch = json.loads(line[6:])["choices"]
                out += (ch[0]["delta"].get("content") or "") if ch else ""
        return f.status, out
MSG = [{"role": "user", "content": "Say hi."}]

st, j = post("/v1/chat/completions", {"model": M, "messages": MSG, "max_tokens": 8, "temperature": 0})
msg = j.get("choices", [{}])[0].get("message", {}) if st == 200 else {}
check(st == 200 and msg.get("content") and "reasoning_content" not in msg,
      "qwen3 parser: a reply without <think> is all content (%d %s)" % (st, msg))

ids = {}
for think in (True, False):
    st, j = post("/tokenize", {"model": M, "messages": MSG, "chat_template_kwargs": {"enable_thinking": think}})
    ids[think] = j.get("tokens", []) if st == 200 else []
st, j = post("/detokenize", {"model": M, "tokens": ids[False]})
check(st == 200 and j.get("prompt", "").endswith("assistant\n<think>\n\n</think>\n\n")
      and len(ids[False]) > len(ids[True]),
      "enable_thinking false: Qwen3's empty think block after the generation prompt (%d -> %d tokens)"
      % (len(ids[True]), len(ids[False])))

rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "properties": {
    "a": {"type": "integer"}}, "required": ["a"]}}}
# structured output with the reasoning on: the grammar holds the answer after the think block (which stays free;
# the block itself is checked in grammar_test, every byte case); this model answers at once, so the grammar
# applies from the first token
msg_json = [{"role": "user", "content": "Describe Paris as JSON."}]
st, j = post("/v1/chat/completions", {"model": M, "messages": msg_json, "max_tokens": 40, "temperature": 0,
                                      "response_format": rf})
try:
    ans = json.loads(j["choices"][0]["message"]["content"]) if st == 200 else None
except ValueError:
    ans = None
check(isinstance(ans, dict) and isinstance(ans.get("a"), int),
      "structured output with the reasoning on: the answer follows the schema (%d %s)" % (st, str(j)[:120]))
st, d = post_stream("/v1/chat/completions", {"model": M, "messages": msg_json, "max_tokens": 40, "temperature": 0,
                                             "response_format": rf, "stream": True})
check(st == 200 and d == j["choices"][0]["message"]["content"], "the same streamed (%r)" % d[:60])
# a forced tool call with the reasoning on: the call under the grammar after the think block, read from the
# content (a think block that mentions <tool_call> is gateway_test's); streamed, the same call
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
tb = {"model": M, "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 60, "temperature": 0,
      "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
st, j = post("/v1/chat/completions", tb)
calls = j["choices"][0]["message"].get("tool_calls") if st == 200 else None
check(calls and calls[0]["function"]["name"] == "get_weather" and "city" in json.loads(calls[0]["function"]["arguments"])
      and j["choices"][0]["finish_reason"] == "tool_calls",
      "a forced tool call with the reasoning on: %s" % (calls[0]["function"]["arguments"] if calls else str(j)[:100]))
r = urllib.request.Request(GW + "/v1/chat/completions", json.dumps(dict(tb, stream=True)).encode(),
                           {"Content-Type": "application/json"})
args, names = "", []
with urllib.request.urlopen(r, timeout=120) as f:
    for line in f.read().decode().splitlines():
        if line.startswith("data: {"):
            ch = json.loads(line[6:])["choices"]
            for tc in (ch[0]["delta"].get("tool_calls") or []) if ch else []:
                names += [tc["function"]["name"]] if tc.get("id") else []
                args += tc["function"].get("arguments") or ""
check(names == ["get_weather"] and calls and json.loads(args) == json.loads(calls[0]["function"]["arguments"]),
      "the same call streamed")
st, j = post("/v1/chat/completions", {"model": M, "messages": MSG, "max_tokens": 16, "response_format": rf,
                                      "chat_template_kwargs": {"enable_thinking": False}})
check(st == 200 and j["choices"][0]["message"]["content"].startswith("{"),
      "structured output with thinking off runs (%d)" % st)
st, j = post("/v1/chat/completions", {"model": M, "messages": MSG, "max_tokens": 4,
                                      "chat_template_kwargs": {"documents": []}})
check(st == 400 and j["error"]["param"] == "chat_template_kwargs", "an unknown template switch is refused by name")
finish("reasoning")
