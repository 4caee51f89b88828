"""Structured outputs through the openai client: every sampled output
parses and validates (jsonschema is the reference), at temperature 1, over
seeds, with n = 4, streamed and not, with stop strings; json_object, choice,
regex and grammar constraints; and refusals that name the field."""
import json
import os
import re
import sys

import jsonschema
import openai

from apiutil import GW, check, failures, model_id, post as post_status, finish as report  # noqa: E402,F401
client = openai.OpenAI(base_url=GW + "/v1", api_key="none", timeout=120, max_retries=0)
MODEL = client.models.list().data[0].id


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "email": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                      "zip": {"type": "string", "maxLength": 10}},
                    "required": ["city"], "additionalProperties": False},
        "active": {"type": "boolean"},
        "born": {"type": "string", "format": "date"},
    },
    "required": ["name", "age", "role", "tags", "address", "active"],
    "additionalProperties": False,
}
MSGS = [{"role": "user", "content": "Invent a user account and give it as JSON."}]
RF = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def validates(text, schema):
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError) as e:
        print("     invalid: %r (%s)" % (text, str(e).splitlines()[0]))
        return False


# ---- JSON Schema, sampled ---------------------------------------------------
outs, finishes = [], []
for seed in (1, 2, 3):
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=300, temperature=1.0, seed=seed, n=4,
                                       response_format=RF)
    for c in r.choices:
        outs.append(c.message.content)
        finishes.append(c.finish_reason)
check(len(outs) == 12 and all(validates(o, PERSON) for o in outs),
      "json_schema: 12 outputs (3 seeds x n=4, temperature 1) all validate")
check(all(f == "stop" for f in finishes), "json_schema: every choice finished with 'stop' (%s)" % sorted(set(finishes)))
check(len(set(outs)) > 6, "json_schema: sampling still varies the outputs (%d distinct of 12)" % len(set(outs)))

# streamed, two choices
texts = {}
finish = {}
stream = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=300, temperature=1.0, seed=7, n=2,
                                        response_format=RF, stream=True)
for ch in stream:
    for c in ch.choices:
        texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        if c.finish_reason:
            finish[c.index] = c.finish_reason
check(len(texts) == 2 and all(validates(t, PERSON) for t in texts.values()),
      "json_schema streamed: both choices' deltas join into valid JSON")
check(finish == {0: "stop", 1: "stop"}, "json_schema streamed: finish_reason stop on each (%s)" % finish)

# completions endpoint, greedy, with a stop string that occurs inside the JSON
r = client.completions.create(model=MODEL, prompt="A user account as JSON:", max_tokens=300, temperature=0,
                              stop=["\",", "}"], extra_body={"guided_json": PERSON})
check(validates(r.choices[0].text, PERSON), "guided_json on /v1/completions with stop strings inside the JSON: valid")

# ---- the other forms -----------------------------------------------------
r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Give me a JSON object."}],
                                   max_tokens=200, temperature=1.0, seed=3, response_format={"type": "json_object"})
try:
    obj = json.loads(r.choices[0].message.content)
    ok = isinstance(obj, dict) or r.choices[0].finish_reason == "length"
except ValueError:
    ok = r.choices[0].finish_reason == "length"
check(ok, "json_object: a JSON object (%r)" % r.choices[0].message.content[:80])

r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is water wet?"}], max_tokens=10,
                                   temperature=1.0, n=4, seed=5, extra_body={"guided_choice": ["yes", "no", "maybe"]})
check(all(c.message.content in ("yes", "no", "maybe") for c in r.choices),
      "guided_choice: %s" % [c.message.content for c in r.choices])

r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=30, temperature=1.0, seed=9, n=3,
                                   extra_body={"structured_outputs": {"regex": "[A-Z][a-z]{2,8}-[0-9]{2,4}"}})
check(all(re.fullmatch("[A-Z][a-z]{2,8}-[0-9]{2,4}", c.message.content) for c in r.choices),
      "structured_outputs.regex: %s" % [c.message.content for c in r.choices])

g = 'root ::= "The answer is " [0-9]+ "."'
r = client.completions.create(model=MODEL, prompt="Q: 2+2?", max_tokens=20, temperature=1.0, seed=2,
                              extra_body={"guided_grammar": g})
check(re.fullmatch(r"The answer is [0-9]+\.", r.choices[0].text) is not None, "guided_grammar: %r" % r.choices[0].text)

# ---- refusals name the field --------------------------------------------
def refusal(**kw):
    try:
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=5, **kw)
    except openai.BadRequestError as e:
        return e.body.get("param") if isinstance(e.body, dict) else None, str(e)
    return None, "accepted"


param, msg = refusal(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}})
check(param == "response_format" and "minimum" in msg and "/properties/n" in msg,
      "an unsupported keyword is a 400 naming it and where: %s" % msg[:160])
param, msg = refusal(response_format={"type": "json_object"}, extra_body={"guided_regex": "a+"})
check(param == "guided_regex" and "only one" in msg, "two constraints are refused: %s" % msg[:120])
param, msg = refusal(extra_body={"guided_grammar": "root ::= missing"})
check(param == "guided_grammar" and "not defined" in msg, "a bad grammar is refused with its error: %s" % msg[:120])
param, msg = refusal(extra_body={"guided_regex": "(a)\\1"})
check(param == "guided_regex" and "backreference" in msg, "an unsupported regex is refused: %s" % msg[:120])

report("structured")
