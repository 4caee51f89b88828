"""Tool calling through the openai client: tool_choice required and named
(enforced by the grammar, so every call names a tool and its arguments
validate against its parameters, at temperature 1, streamed and not),
parallel_tool_calls, a round trip with tool results, none, and refusals."""
import json
import os
import sys
import urllib.request

import jsonschema
import openai

from apiutil import GW, check, failures, model_id, post as post_status, finish as report  # noqa: E402,F401
client = openai.OpenAI(base_url=GW + "/v1", api_key="none", timeout=120, max_retries=0)
MODEL = client.models.list().data[0].id


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 30},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
       "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Adds two integers", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
MSGS = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def valid_call(tc, names=("get_weather", "add")):
    try:
        ok = tc.type == "function" and tc.id.startswith("call_") and tc.function.name in names
        jsonschema.validate(json.loads(tc.function.arguments), SCHEMAS[tc.function.name])
        return ok
    except (ValueError, KeyError, jsonschema.ValidationError) as e:
        print("     invalid call %s: %s" % (tc, e))
        return False


# ---- required, one call, sampled ----------------------------------------------
calls, fins, ids = [], [], set()
for seed in (1, 2, 3):
    r = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice="required", n=2, seed=seed,
                                       temperature=1.0, max_tokens=200, parallel_tool_calls=False)
    for c in r.choices:
        calls.append(c.message.tool_calls or [])
        fins.append(c.finish_reason)
        ids.update(t.id for t in c.message.tool_calls or [])
check(all(len(cs) == 1 and valid_call(cs[0]) for cs in calls) and len(calls) == 6,
      "tool_choice required (3 seeds x n=2, temperature 1): one call each, to a known tool, with valid arguments")
check(all(f == "tool_calls" for f in fins) and len(ids) == 6, "finish_reason tool_calls, and every call its own id")

# ---- a named function -------------------------------------------------------
r = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, temperature=1.0, seed=4, n=3, max_tokens=200,
                                   tool_choice={"type": "function", "function": {"name": "add"}}, parallel_tool_calls=False)
check(all(c.message.tool_calls and len(c.message.tool_calls) == 1 and valid_call(c.message.tool_calls[0], ("add",))
          for c in r.choices), "tool_choice naming 'add': every choice calls add with valid arguments")

# ---- parallel calls ------------------------------------------------------------
r = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice="required", temperature=0,
                                   max_tokens=300)
tcs = r.choices[0].message.tool_calls or []
check(len(tcs) >= 1 and all(valid_call(t) for t in tcs), "parallel_tool_calls (the default): %d valid calls" % len(tcs))

# ---- streamed ------------------------------------------------------------------
acc, fin, pieces, first = {}, None, 0, None
for ch in client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice="required", temperature=1.0,
                                         seed=5, max_tokens=200, stream=True, parallel_tool_calls=False):
    for c in ch.choices:
        for tc in c.delta.tool_calls or []:
            if first is None:
                first = tc
            pieces += 1
            a = acc.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            a["id"] += tc.id or ""
            a["name"] += tc.function.name or "" if tc.function else ""
            a["arguments"] += tc.function.arguments or "" if tc.function else ""
        fin = c.finish_reason or fin
ok = len(acc) == 1 and fin == "tool_calls"
try:
    ok = ok and acc[0]["name"] in SCHEMAS and acc[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(acc[0]["arguments"]), SCHEMAS[acc[0]["name"]])
except (ValueError, KeyError, jsonschema.ValidationError):
    ok = False
check(ok, "streamed: the tool call's deltas join into a valid call, finish_reason tool_calls (%s)" % acc)
# as OpenAI streams them: the id, type and name first, then the arguments as they are written
check(first is not None and first.id and first.type == "function" and first.function.name and pieces >= 4,
      "streamed: the call goes out as it is written: id and name first, arguments in %d deltas" % pieces)

# ---- a round trip: the call and its result go back in -------------------------
r = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice="required", temperature=0,
                                   max_tokens=200, parallel_tool_calls=False)
call = r.choices[0].message.tool_calls[0]
history = MSGS + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}]
r2 = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=30, temperature=0)
check(r2.choices[0].finish_reason in ("stop", "length", "tool_calls") and r2.usage.prompt_tokens > r.usage.prompt_tokens,
      "a tool result in the history is accepted and reaches the prompt (%d > %d tokens)"
      % (r2.usage.prompt_tokens, r.usage.prompt_tokens))


def count(body):
    req = urllib.request.Request(GW + "/tokenize", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as f:
        return json.loads(f.read())["count"]


r = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, tool_choice="none", max_tokens=20, temperature=0)
plain = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=20, temperature=0)
check(not r.choices[0].message.tool_calls and r.usage.prompt_tokens == plain.usage.prompt_tokens == count({"messages": MSGS}),
      "tool_choice none: no calls, and the tools stay out of the prompt")
auto = client.chat.completions.create(model=MODEL, messages=MSGS, tools=TOOLS, max_tokens=20, temperature=0)
check(auto.usage.prompt_tokens > plain.usage.prompt_tokens, "tool_choice auto (the default with tools): the tools are in the prompt")


# ---- refusals name the field ----------------------------------------------------
def refusal(**kw):
    try:
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=5, **kw)
    except openai.BadRequestError as e:
        return e.body.get("param") if isinstance(e.body, dict) else None
    return "accepted"


check(refusal(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}) == "tool_choice",
      "a tool_choice naming an unknown function: 400 naming tool_choice")
check(refusal(tools=[{"type": "function", "function": {"name": "bad name!"}}]) == "tools", "a bad function name: 400 naming tools")
check(refusal(tool_choice="required") == "tool_choice", "tool_choice without tools: 400")
check(refusal(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}) == "tool_choice",
      "tool_choice required with response_format: 400")
check(refusal(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "x": {"type": "string", "pattern": "a+"}}}}}], tool_choice="required") == "tools",
      "a tool whose parameters use an unsupported keyword, under required: 400 naming tools")
report("tools")
