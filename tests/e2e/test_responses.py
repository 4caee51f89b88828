"""OpenAI's Responses API (/v1/responses) against a real gateway and worker,
through the `openai` SDK: create (a string, items, instructions), the
stream helper and the raw event sequence, previous_response_id, retrieve and
delete, store false, function tools (a forced call, then its output as an
item), text.format json_schema; every response and every streamed event
validated against the SDK's own types as JSON schemas (jsonschema); fields we
do not honour refused by name; stored responses belong to their API key.
GW: a gateway started with --api-key KEY and --api-key KEY2."""
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apiutil import GW, check, finish, sse_events  # noqa: E402

import jsonschema  # noqa: E402
import openai  # noqa: E402
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

KEY, KEY2 = os.environ["KEY"], os.environ["KEY2"]
c = openai.OpenAI(base_url=GW + "/v1", api_key=KEY, timeout=120, max_retries=0)
c2 = openai.OpenAI(base_url=GW + "/v1", api_key=KEY2, timeout=120, max_retries=0)
M = c.models.list().data[0].id
G = {"temperature": 0}

# ---- the shapes: the SDK's types as JSON schemas ---------------------------------------
RESP_SCHEMA = Response.model_json_schema()
EVENT_SCHEMA = TypeAdapter(ResponseStreamEvent).json_schema()


def valid(schema, body, what):
    e = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(body))
    if e is None:
        return True
    check(False, "%s: %s at %s" % (what, e.message[:200], list(e.absolute_path)))
    return False


def raw(body, key=KEY, method="POST", path="/v1/responses"):
    r = urllib.request.Request(GW + path, json.dumps(body).encode() if body is not None else None,
                               {"Content-Type": "application/json", "Authorization": "Bearer " + key}, method=method)
    try:
        with urllib.request.urlopen(r, timeout=120) as f:
            d = f.read().decode()
            return f.status, d
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# ---- create ------------------------------------------------------------------------------
r = c.responses.create(model=M, input="What is the capital of France?", instructions="Answer in one short sentence.",
                       max_output_tokens=24, **G)
check(r.id.startswith("resp_") and r.object == "response" and r.status in ("completed", "incomplete") and r.output_text
      and r.output[0].type == "message" and r.usage.input_tokens > 0 and r.usage.output_tokens > 0
      and r.instructions == "Answer in one short sentence.",
      "SDK create: %s, %r, usage %d in / %d out" % (r.status, r.output_text[:40], r.usage.input_tokens,
                                                    r.usage.output_tokens))
st, d = raw({"model": M, "input": "What is the capital of France?", "instructions": "Answer in one short sentence.",
             "max_output_tokens": 24, "temperature": 0})
body = json.loads(d)
check(st == 200 and valid(RESP_SCHEMA, body, "schema: response") and
      body["output"][0]["content"][0]["text"] == r.output_text, "raw create: schema-valid, the same greedy text")
r4 = c.responses.create(model=M, input="Tell me a story.", max_output_tokens=4, **G)
check(r4.status == "incomplete" and r4.incomplete_details.reason == "max_output_tokens" and r4.usage.output_tokens == 4,
      "max_output_tokens 4: incomplete (max_output_tokens), 4 tokens")
items = c.responses.create(model=M, max_output_tokens=8, **G, input=[
    {"role": "system", "content": "You are terse."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}])
check(items.status in ("completed", "incomplete") and items.output_text, "input as items (text parts, system)")

# ---- continuing: previous_response_id, retrieve, delete, store false ----------------------------
r2 = c.responses.create(model=M, input="And of Germany?", previous_response_id=r.id, max_output_tokens=24, **G)
check(r2.previous_response_id == r.id and r2.output_text and r2.usage.input_tokens > r.usage.input_tokens,
      "previous_response_id: the conversation goes on (%d > %d input tokens)" % (r2.usage.input_tokens,
                                                                               r.usage.input_tokens))
# the same conversation sent whole gives the same greedy reply
whole = c.responses.create(model=M, max_output_tokens=24, **G, instructions=None, input=[
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": r.output_text}, {"role": "user", "content": "And of Germany?"}])
check(whole.output_text == r2.output_text, "continued = the whole conversation sent as items: %r" % r2.output_text[:40])
its = c.responses.input_items.list(r2.id).data
check([(i.type, getattr(i, "role", None)) for i in its] == [("message", "user"), ("message", "assistant"),
                                                             ("message", "user")]
      and its[0].content[0].text == "And of Germany?" and its[1].content[0].text == r.output_text,
      "input_items: the conversation that led to it, newest first (instructions are not carried)")
st, d = raw(None, method="GET", path="/v1/responses/%s/input_items" % r2.id)
check(st == 200 and json.loads(d)["object"] == "list", "raw input_items")
got = c.responses.retrieve(r.id)
check(got.id == r.id and got.output_text == r.output_text, "retrieve: the stored response")
st, d = raw(None, method="GET", path="/v1/responses/" + r.id)
check(st == 200 and valid(RESP_SCHEMA, json.loads(d), "schema: retrieved"), "raw retrieve: schema-valid")
st, d = raw(None, key=KEY2, method="GET", path="/v1/responses/" + r.id)
check(st == 404, "another API key does not see it (%d)" % st)
st, d = raw({"model": M, "input": "x", "previous_response_id": r.id, "max_output_tokens": 2}, key=KEY2)
check(st == 404 and json.loads(d)["error"]["param"] == "previous_response_id",
      "nor continue it (404 previous_response_id)")
ns = c.responses.create(model=M, input="Hi", store=False, max_output_tokens=4, **G)
try:
    c.responses.retrieve(ns.id)
    check(False, "store false: retrievable")
except openai.NotFoundError:
    check(ns.store is False, "store false: not stored (404)")
c.responses.delete(r2.id)
try:
    c.responses.retrieve(r2.id)
    check(False, "delete: still there")
except openai.NotFoundError:
    check(True, "delete: gone (404)")
try:
    c.responses.create(model=M, input="x", previous_response_id="resp_nope", max_output_tokens=2)
    check(False, "an unknown previous_response_id: accepted")
except openai.NotFoundError as e:
    check("resp_nope" in str(e), "an unknown previous_response_id: 404 naming it")

# ---- streaming -----------------------------------------------------------------------------
with c.responses.stream(model=M, input="What is the capital of France?", instructions="Answer in one short sentence.",
                        max_output_tokens=24, **G) as s:
    deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
    final = s.get_final_response()
check(deltas == r.output_text and final.output_text == r.output_text and final.status == r.status,
      "SDK stream: the deltas and the final response as the unstreamed one")
st, d = raw({"model": M, "input": "Say hi.", "max_output_tokens": 6, "temperature": 0, "stream": True})
ev = sse_events(d)
names = [n for n, _ in ev]
check(st == 200 and names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                                  "response.content_part.added"] and names[-4:] == [
    "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]
    and [x["sequence_number"] for _, x in ev] == list(range(len(ev))) and all(n == x["type"] for n, x in ev),
    "the event sequence, numbered 0..%d: %s ... %s" % (len(ev) - 1, names[:2], names[-1:]))
check(all(valid(EVENT_SCHEMA, x, "schema: event %s" % n) for n, x in ev), "every event schema-valid")
sid = ev[0][1]["response"]["id"]
st, d = raw(None, method="GET", path="/v1/responses/" + sid)
check(st == 200 and json.loads(d)["output"] == ev[-1][1]["response"]["output"],
      "a streamed response is stored before its last event (retrieved at once: the same output)")

# ---- tools ----------------------------------------------------------------------------------
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
t = c.responses.create(model=M, input="What is the weather in Paris?", tools=TOOLS, tool_choice="required",
                       parallel_tool_calls=False, max_output_tokens=60, **G)
calls = [o for o in t.output if o.type == "function_call"]
check(calls and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments) and calls[0].call_id,
      "a forced tool call: a function_call item %s" % (calls[0].arguments if calls else t.output))
if calls:
    t2 = c.responses.create(model=M, previous_response_id=t.id, tools=TOOLS, max_output_tokens=24, **G, input=[
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "{\"temp_c\": 21}"}])
    check(t2.status in ("completed", "incomplete") and t2.output, "the call's output as an item: the conversation goes on")
with c.responses.stream(model=M, input="What is the weather in Paris?", tools=TOOLS, tool_choice="required",
                        parallel_tool_calls=False, max_output_tokens=60, **G) as s:
    argd = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
    sf = s.get_final_response()
scalls = [o for o in sf.output if o.type == "function_call"]
check(len(scalls) == len(calls) == 1 and scalls[0].arguments == argd
      and json.loads(scalls[0].arguments) == json.loads(calls[0].arguments),
      "streamed: the same call (as the chat path streams it, arguments as written), its arguments as deltas")

# ---- structured output ----------------------------------------------------------------------
fmt = {"format": {"type": "json_schema", "name": "city", "strict": True, "schema": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
    "required": ["name", "population"], "additionalProperties": False}}}
js = c.responses.create(model=M, input="Describe Paris.", text=fmt, max_output_tokens=60, **G)
try:
    obj = json.loads(js.output_text)
    check(set(obj) == {"name", "population"} and isinstance(obj["population"], int),
          "text.format json_schema: %s" % js.output_text)
except ValueError:
    check(False, "text.format json_schema: not JSON: %r" % js.output_text)

# ---- refused by name ------------------------------------------------------------------------
for body, param in (({"input": "x", "background": True}, "background"),
                    ({"input": "x", "conversation": "c1"}, None),
                    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
                    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
                    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
                    ({"input": "x", "truncation": "auto"}, "truncation"),
                    ({"input": "x", "temperature": 5}, "temperature"),
                    ({}, "input")):
    st, d = raw(dict(body, model=M))
    e = json.loads(d).get("error", {})
    what = param or next(iter(body.keys() - {"input"}))
    check(st == 400 and e.get("param") == param and what in e.get("message", ""),
          "refused by name: %s (%d %s)" % (what, st, e.get("message", "")[:80]))
st, d = raw(None, method="PUT", path="/v1/responses/" + sid)
check(st == 405, "PUT /v1/responses/{id}: 405")
finish("test_responses")
