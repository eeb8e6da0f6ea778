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


async def test_a_run_survives_the_models_call_of_a_tool_the_agent_does_not_have(
    app_url: str,
) -> None:
    """The scripted model (``UNKNOWN-THEN-WEATHER``) first calls ``echo``, which the agent does
    not have: the app answers that call inside the response, so the SDK never sees it (as a
    ``function_call`` named echo it failed the run: ModelBehaviorError, "Tool echo not found in
    agent weather"); the model reads the answer, calls the agent's tool, and answers."""
    set_tracing_disabled(True)
    calls: list[str] = []

    # Not strict: a strict tool's grammar would leave the model no recipient but the agent's
    # own tools (constrained decoding), and the simulated engine holds its script to it.
    @function_tool(strict_mode=False)
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
    result = await Runner.run(agent, "UNKNOWN-THEN-WEATHER: weather in Paris?")

    assert calls == ["Paris"]
    assert result.final_output == "It is sunny in Paris."
    first = result.raw_responses[0]
    assert [item.type for item in first.output] == ["reasoning", "reasoning", "function_call"]
    called = [
        item.name
        for response in result.raw_responses
        for item in response.output
        if item.type == "function_call"
    ]
    assert called == ["get_weather"]


async def test_hosted_mcp_tool_with_an_approval_callback_runs_its_call(app_url: str) -> None:
    """The Agents SDK's `HostedMCPTool`: the app lists the server and asks for approval; the
    SDK's `on_approval_request` approves, the SDK sends the `mcp_approval_response` on its next
    turn and the app runs the call and answers (tests/app/test_mcp.py has the servers)."""
    from agents import HostedMCPTool

    from tests.support.mcp_app import port
    from tests.support.mcp_servers import mcp_server

    set_tracing_disabled(True)
    asked: list[tuple[str, str, str]] = []

    def approve(request):
        data = request.data
        asked.append((data.server_label, data.name, data.arguments))
        return {"approve": True}

    with mcp_server("good", port=port("agents")) as server:
        tool = HostedMCPTool(
            tool_config={
                "type": "mcp",
                "server_label": "docs",
                "server_url": server.url,
                "require_approval": "always",
            },
            on_approval_request=approve,
        )
        client = AsyncOpenAI(base_url=f"{app_url}/v1", api_key="sk-test", max_retries=0)
        agent = Agent(
            name="docs",
            instructions="Use the docs server.",
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            tools=[tool],
        )
        result = await Runner.run(agent, "MCP-ECHO-TASK", auto_previous_response_id=True)

    assert asked == [("docs", "echo", '{"text": "MCP-ECHOED-7"}')]
    assert result.final_output == "The server said MCP-ECHOED-7."
    types = [item.type for item in result.new_items]
    assert "mcp_approval_request_item" in types and "mcp_approval_response_item" in types
    calls = [
        item
        for response in result.raw_responses
        for item in response.output
        if item.type == "mcp_call"
    ]
    assert [call.output for call in calls] == ["MCP-ECHOED-7"]


async def test_a_compaction_session_compacts_and_the_next_run_sends_the_compaction(
    app_url: str,
) -> None:
    """The Agents SDK's `OpenAIResponsesCompactionSession`: after a run it compacts the session's
    history with `responses.compact` (here after every run) and keeps what comes back, the
    user's messages and one compaction item; the next run sends that with its new message, and
    the app opens the compaction item (one it could not open would be a 400)."""
    from agents import SQLiteSession
    from agents.memory import OpenAIResponsesCompactionSession

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{app_url}/v1", api_key="sk-test", max_retries=0)
    session = OpenAIResponsesCompactionSession(
        "weather",
        SQLiteSession("weather"),  # in memory
        client=client,
        model=MODEL,
        should_trigger_compaction=lambda context: True,
    )
    agent = Agent(
        name="weather",
        instructions="Answer weather questions.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
    )
    first = await Runner.run(agent, "SDK-TEXT: is it sunny in Paris?", session=session)
    assert first.final_output == "Hello from the scripted engine."
    kept = [item.get("type") for item in await session.get_items()]
    assert kept == ["message", "compaction"]

    second = await Runner.run(agent, "SDK-REASON: and tomorrow?", session=session)
    assert second.final_output == "Hi there."
    kept = [item.get("type") for item in await session.get_items()]
    assert kept == ["message", "message", "compaction"]
