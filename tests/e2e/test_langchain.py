"""LangChain against the gateway: ChatOpenAI(...).with_structured_output()
with a Pydantic model, by JSON Schema (response_format json_schema) and by
JSON mode, and bind_tools with tool_choice "any" and a named tool; every
answer must come back as a validated object or tool call."""
import os
import sys
from typing import List, Literal, Optional

from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field, constr

from apiutil import GW, check, failures, model_id, post as post_status, finish as report  # noqa: E402,F401


class Address(BaseModel):
    city: str = Field(max_length=30)
    country: str = Field(max_length=30)


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int
    role: Literal["admin", "user", "guest"]
    nicknames: List[constr(max_length=20)] = Field(max_length=3)
    address: Address
    email: Optional[constr(max_length=40)] = None


import urllib.request, json  # noqa: E402
with urllib.request.urlopen(GW + "/v1/models", timeout=10) as f:
    MODEL = json.loads(f.read())["data"][0]["id"]
# every string bounded: the longest answer fits max_tokens even at one character a token
llm = ChatOpenAI(base_url=GW + "/v1", api_key="none", model=MODEL, temperature=1.0, max_tokens=1000, max_retries=0,
                 timeout=120)
got = []
for seed in range(4):
    s = llm.bind(seed=seed).with_structured_output(Person, method="json_schema", strict=True)
    try:
        p = s.invoke("Invent a person and describe them.")
        got.append(isinstance(p, Person))
    except Exception as e:  # a validation error is a failure
        print("     %s: %s" % (type(e).__name__, str(e)[:300]))
        got.append(False)
check(all(got) and len(got) == 4, "with_structured_output(Person, method='json_schema'): 4 of 4 validated (%s)" % got)
try:
    greedy = ChatOpenAI(base_url=GW + "/v1", api_key="none", model=MODEL, temperature=0, max_tokens=400, max_retries=0,
                        timeout=120)
    r = greedy.with_structured_output(None, method="json_mode").invoke("Give me a JSON object with a cat's name and age.")
    ok = isinstance(r, dict)
except Exception as e:
    print("     %s: %s" % (type(e).__name__, str(e)[:300]))
    ok = False
check(ok, "with_structured_output(method='json_mode'): a dict")
from langchain_core.tools import tool  # noqa: E402


@tool
def get_weather(city: constr(max_length=30), unit: Literal["celsius", "fahrenheit"]) -> str:
    """The current weather in a city."""
    return "sunny"


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


for choice, want in (("any", ("get_weather", "add")), ("add", ("add",))):
    try:
        ai = greedy.bind_tools([get_weather, add], tool_choice=choice).invoke("What is the weather in Paris?")
        tc = ai.tool_calls
        ok = len(tc) >= 1 and all(t["name"] in want and isinstance(t["args"], dict) for t in tc)
        for t in tc:  # the arguments fit the tool's own schema
            (get_weather if t["name"] == "get_weather" else add).args_schema.model_validate(t["args"])
    except Exception as e:
        print("     %s: %s" % (type(e).__name__, str(e)[:300]))
        ok, tc = False, None
    check(ok, "bind_tools(tool_choice=%r): %s" % (choice, [(t["name"], t["args"]) for t in tc or []]))
report("langchain")
