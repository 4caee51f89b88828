"""The OpenAI Agents SDK (openai-agents) on our Responses API: an agent
answers, and an agent with a function tool calls it (forced by tool_choice)
and stops on its result; a second run continues the first by
previous_response_id. GW: the gateway; KEY: its API key."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apiutil import GW, check, finish  # noqa: E402

from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool,  # noqa: E402
                    set_tracing_disabled)
from openai import AsyncOpenAI  # noqa: E402

set_tracing_disabled(True)  # no trace export: nothing leaves the machine
client = AsyncOpenAI(base_url=GW + "/v1", api_key=os.environ["KEY"], max_retries=0, timeout=120)
M = os.environ["MODEL_ID"]
calls = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return "sunny, 21 C"


def model():
    return OpenAIResponsesModel(model=M, openai_client=client)


plain = Agent(name="plain", instructions="Answer briefly.", model=model(),
              model_settings=ModelSettings(temperature=0, max_tokens=24))
r = Runner.run_sync(plain, "Say hi.")
check(isinstance(r.final_output, str) and r.final_output.strip(), "an agent answers: %r" % r.final_output[:60])
r2 = Runner.run_sync(plain, "Say it again.", previous_response_id=r.last_response_id)
check(isinstance(r2.final_output, str) and r2.final_output.strip(),
      "a run continuing the last by previous_response_id: %r" % r2.final_output[:60])
tooled = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model(),
               model_settings=ModelSettings(temperature=0, max_tokens=60, tool_choice="get_weather"),
               tool_use_behavior="stop_on_first_tool")
r = Runner.run_sync(tooled, "What is the weather in Paris?", max_turns=3)
check(calls and r.final_output == "sunny, 21 C", "an agent calls its function tool (%s) and stops on its result" % calls)
finish("test_agents")
