"""The OpenAI Agents SDK runs a function tool against the app with server-side chaining."""

from __future__ import annotations

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI, OpenAI

from tests.support import MODEL


async def test_agent_runs_its_tool_and_answers_with_previous_response_id(app_url: str) -> None:
    set_tracing_disabled(True)  # no trace upload: nothing leaves this machine
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return f"WEATHER-RESULT: sunny in {city}"

    client = AsyncOpenAI(base_url=f"{app_url}/v1", api_key="sk-test", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer weather questions with the tool.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        tools=[get_weather],
    )
    result = await Runner.run(agent, "SDK-TOOL: weather in Paris?", auto_previous_response_id=True)

    assert calls == ["Paris"]
    assert result.final_output == "It is sunny in Paris."
    first, last = result.raw_responses[0], result.raw_responses[-1]
    stored = OpenAI(base_url=f"{app_url}/v1", api_key="sk-test").responses.retrieve(
        last.response_id
    )
    # The tool's output was sent against the first response, not with the history re-sent.
    assert stored.previous_response_id == first.response_id
