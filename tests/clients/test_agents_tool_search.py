"""The OpenAI Agents SDK with a deferred tool and the hosted ``tool_search``: the server's
search finds the tool inside the response, the agent runs it and the model answers."""

from __future__ import annotations

from agents import (
    Agent,
    OpenAIResponsesModel,
    Runner,
    ToolSearchTool,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from tests.support import API_KEY, MODEL


async def test_an_agent_finds_its_deferred_tool_by_the_servers_search(app_url: str) -> None:
    set_tracing_disabled(True)  # no trace upload: nothing leaves this machine
    calls: list[str] = []

    @function_tool(defer_loading=True)
    def get_forecast(city: str) -> str:
        """Weather forecast for a city, tomorrow."""
        calls.append(city)
        return f"FORECAST-RESULT: sunny in {city}"

    @function_tool(defer_loading=True)
    def send_invoice(to: str) -> str:
        """Send an invoice by mail."""
        raise AssertionError("not the tool the model needs")

    client = AsyncOpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, max_retries=0)
    agent = Agent(
        name="forecaster",
        instructions="Answer with the tools you find.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        tools=[ToolSearchTool(), get_forecast, send_invoice],
    )
    result = await Runner.run(agent, "TSEARCH-QUERY: the weather in Paris tomorrow?")

    assert calls == ["Paris"]
    assert result.final_output == "Sunny in Paris tomorrow."
    first = result.raw_responses[0].output
    assert [item.type for item in first][-3:] == [
        "tool_search_call",
        "tool_search_output",
        "function_call",
    ]
