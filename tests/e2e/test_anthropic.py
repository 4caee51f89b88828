"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) against
a real gateway and worker: the `anthropic` SDK (create, stream, count_tokens,
forced tool use and a tool_result round trip, x-api-key), and the raw wire
(the streaming event sequence, errors in Anthropic's shape, fields refused by
name). GW: the gateway (started with --api-key KEY)."""
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apiutil import GW, check, finish, sse_events, model_id  # noqa: E402

import anthropic  # noqa: E402

KEY = os.environ["KEY"]
M = model_id_key = None


def raw(path, body, key=KEY, stream=False):
    r = urllib.request.Request(GW + path, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                      "x-api-key": key, "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(r, timeout=120) as f:
            d = f.read().decode()
            return f.status, d if stream else json.loads(d)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


r = urllib.request.Request(GW + "/v1/models", headers={"Authorization": "Bearer " + KEY})
M = json.loads(urllib.request.urlopen(r, timeout=10).read())["data"][0]["id"]
c = anthropic.Anthropic(base_url=GW, api_key=KEY, max_retries=0)
MSG = [{"role": "user", "content": "What is the capital of France?"}]

G = {"extra_body": {"temperature": 0}}  # greedy (the SDK no longer has the field; the server still takes it)
m = c.messages.create(model=M, max_tokens=24, system="Answer in one short sentence.", messages=MSG, **G)
check(m.id.startswith("msg_") and m.role == "assistant" and m.content and m.content[0].type == "text" and m.content[0].text
      and m.stop_reason in ("end_turn", "max_tokens") and m.usage.input_tokens > 0 and m.usage.output_tokens > 0,
      "SDK create: a text block, stop_reason %s, usage %d in / %d out" % (m.stop_reason, m.usage.input_tokens,
                                                                          m.usage.output_tokens))
m4 = c.messages.create(model=M, max_tokens=4, messages=MSG, **G)
check(m4.stop_reason == "max_tokens" and m4.usage.output_tokens == 4, "max_tokens 4: stop_reason max_tokens, 4 tokens out")
n = c.messages.count_tokens(model=M, system="Answer in one short sentence.", messages=MSG)
check(n.input_tokens == m.usage.input_tokens, "count_tokens: %d, as create's input_tokens %d" % (n.input_tokens,
                                                                                                m.usage.input_tokens))
with c.messages.stream(model=M, max_tokens=16, messages=MSG, **G) as s:
    text = "".join(s.text_stream)
    fm = s.get_final_message()
check(text and fm.content[0].text == text and fm.stop_reason in ("end_turn", "max_tokens") and fm.usage.output_tokens > 0,
      "SDK stream: text deltas add up to the final message (%d tokens)" % fm.usage.output_tokens)

# the wire: greedy, streamed and not, the same text; the documented event sequence
body = {"model": M, "max_tokens": 12, "messages": MSG, "temperature": 0}
st, plain = raw("/v1/messages", body)
st2, sse = raw("/v1/messages", dict(body, stream=True), stream=True)
ev = sse_events(sse)
names = [e for e, _ in ev]
streamed = "".join(d["delta"]["text"] for e, d in ev if e == "content_block_delta")
check(st == 200 and st2 == 200 and names[:3] == ["message_start", "ping", "content_block_start"] and
      names[-3:] == ["content_block_stop", "message_delta", "message_stop"] and
      set(names[3:-3]) == {"content_block_delta"}, "stream events in Anthropic's order: %s" % names[:4])
check(streamed == plain["content"][0]["text"] and ev[-2][1]["delta"]["stop_reason"] == plain["stop_reason"] and
      ev[-2][1]["usage"]["output_tokens"] == plain["usage"]["output_tokens"],
      "greedy: the streamed text, stop_reason and usage equal the whole reply's")

# stop_sequences: the one that matched comes back, streamed and not
ss = c.messages.create(model=M, max_tokens=40, messages=[{"role": "user", "content": "Count from 1 to 10."}],
                       stop_sequences=["5", "7"], **G)
with c.messages.stream(model=M, max_tokens=40, messages=[{"role": "user", "content": "Count from 1 to 10."}],
                       stop_sequences=["5", "7"], **G) as s:
    sf = s.get_final_message()
check(((ss.stop_reason == "stop_sequence" and ss.stop_sequence in ("5", "7")) or
       (ss.stop_reason != "stop_sequence" and ss.stop_sequence is None)) and
      (sf.stop_reason, sf.stop_sequence) == (ss.stop_reason, ss.stop_sequence),
      "SDK stop_sequences, streamed and not: stop_reason %s, stop_sequence %r" % (ss.stop_reason, ss.stop_sequence))
st, j = raw("/v1/messages", {"model": M, "max_tokens": 40, "temperature": 0, "stop_sequences": [","],
                             "messages": [{"role": "user", "content": "List three colors, separated by commas."}]})
check(st == 200 and j["stop_reason"] == "stop_sequence" and j["stop_sequence"] == ","
      and "," not in j["content"][0]["text"] if j.get("content") else False,
      "greedy with stop_sequences [',']: stop_reason stop_sequence, stop_sequence ',' (%s)" % j.get("stop_reason"))

# tools: forced, then a tool_result round trip
tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
t = c.messages.create(model=M, max_tokens=64, tools=tools, tool_choice={"type": "tool", "name": "get_weather"},
                      messages=[{"role": "user", "content": "Weather in Oslo?"}], **G)
use = [b for b in t.content if b.type == "tool_use"]
check(t.stop_reason == "tool_use" and use and use[0].name == "get_weather" and isinstance(use[0].input, dict) and
      "city" in use[0].input, "forced tool use: a tool_use block with its input (%s)" % (use[0].input if use else None))
if use:
    t2 = c.messages.create(model=M, max_tokens=16, tools=tools, messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": use[0].id, "name": "get_weather", "input": use[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "12 C, rain"}]}])
    check(t2.content and t2.stop_reason in ("end_turn", "max_tokens", "tool_use"), "a tool_result round trip answers")

# errors, in Anthropic's shape
st, j = raw("/v1/messages", {"model": M, "messages": MSG})
check(st == 400 and j["type"] == "error" and j["error"]["type"] == "invalid_request_error" and "max_tokens" in
      j["error"]["message"], "no max_tokens: 400 invalid_request_error naming it")
st, j = raw("/v1/messages", dict(body, thinking={"type": "enabled", "budget_tokens": 1024}))
check(st == 400 and "thinking" in j["error"]["message"], "thinking: refused by name")
st, j = raw("/v1/messages", dict(body, messages=[{"role": "user", "content": [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]))
check(st == 400 and "image" in j["error"]["message"], "an image block: refused by name")
st, j = raw("/v1/messages", body, key="wrong")
check(st == 401 and j["type"] == "error" and j["error"]["type"] == "authentication_error", "a wrong x-api-key: 401 authentication_error")
try:
    anthropic.Anthropic(base_url=GW, api_key="wrong", max_retries=0).messages.create(model=M, max_tokens=4, messages=MSG)
    check(False, "SDK: a wrong key raises")
except anthropic.AuthenticationError:
    check(True, "SDK: a wrong key raises AuthenticationError")
finish("anthropic")
