"""The door on gpt-oss's own tools, through the openai SDK on the in-process API: without the
tool server that runs it, a code_interpreter tool is a 400 naming ``tools[i].type`` (on
``/input_tokens`` too), and a web_search tool (which Codex sends by default) is left out and
the request served without it: the model is not offered the browser and reads that web search
is unavailable, the client sees the omission in a header, on HTTP, SSE, background runs and
WebSockets alike; an operator who sets ``web_search_without_browser: refuse`` gets OpenAI's 400
instead. A container other than ``auto`` is a 400 naming ``tools[i].container``; with the
servers named, the request is served."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from serve_app.config import AppArgs, ToolArgs
from serve_app.engines.base import GenerateChunk, GenerateRequest
from tests.support import MODEL
from tests.support.helpers import decode, in_process_api, on_uvicorn, sdk_client
from tests.support.websocket import TERMINAL

FUNCTION = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
# Never reached: the simulated engine (no script) calls no tool.
UNUSED_SERVER = "http://127.0.0.1:9/mcp"


@pytest.fixture
async def bare(tmp_path: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    async with in_process_api(tmp_path / "bare.db") as api:
        yield sdk_client(api)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    tools = ToolArgs(browser_server_url=UNUSED_SERVER, python_server_url=UNUSED_SERVER)
    async with in_process_api(tmp_path / "served.db", AppArgs(tools=tools)) as api:
        yield sdk_client(api)


async def error_of(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as caught:
        await call
    return caught.value.body  # type: ignore[return-value]


@pytest.fixture
async def strict(tmp_path: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    args = AppArgs(tools=ToolArgs(web_search_without_browser="refuse"))
    async with in_process_api(tmp_path / "strict.db", args) as api:
        yield sdk_client(api)


@pytest.mark.parametrize(
    ("tools", "param", "tool_type", "client_remedy"),
    [
        ([FUNCTION, {"type": "web_search"}], "tools[1].type", "web_search", True),
        ([{"type": "web_search_preview"}], "tools[0].type", "web_search_preview", True),
        ([{"type": "code_interpreter", "container": {"type": "auto"}}], "tools[0].type",
         "code_interpreter", False),
    ],
)  # fmt: skip
async def test_a_tool_without_its_server_is_a_400_where_the_operator_refuses(
    strict: openai.AsyncOpenAI, tools: list[dict], param: str, tool_type: str, client_remedy: bool
) -> None:
    body = {"model": MODEL, "input": "hi", "tools": tools}
    for call in (strict.responses.create(**body), strict.responses.input_tokens.count(**body)):
        error = await error_of(call)
        assert error["param"] == param and error["code"] is None
        assert error["message"].startswith(f"Tool '{tool_type}' is not supported with {MODEL}")
        assert "tool server (the operator sets tools." in error["message"]
        # What the client can do: leave it out (Codex's setting named).
        assert ('web_search = "disabled"' in error["message"]) is client_remedy


async def test_code_interpreter_without_its_server_is_a_400_by_default(
    bare: openai.AsyncOpenAI,
) -> None:
    tools = [{"type": "code_interpreter", "container": {"type": "auto"}}]
    error = await error_of(bare.responses.create(model=MODEL, input="hi", tools=tools))
    assert error["param"] == "tools[0].type"


# --- web_search without a browser server: served without it -----------------------------------


@pytest.fixture
async def recorded(tmp_path: Path) -> AsyncIterator[FastAPI]:
    """The default app (no tool server), the prompts its engine is sent kept in
    ``state.prompts``."""
    async with in_process_api(tmp_path / "omit.db") as api:
        api.state.prompts = []
        generate = api.state.engine.generate

        def kept(request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
            api.state.prompts.append(decode(request.prompt_token_ids))
            return generate(request)

        api.state.engine.generate = kept
        yield api


CODEX_WEB_SEARCH = {"type": "web_search", "external_web_access": True}


def system_message(prompt: str) -> str:
    return prompt.split("<|end|>", 1)[0]


async def omitted_count(api: FastAPI, tool_type: str) -> float:
    """``serve_app_tools_omitted_total`` for ``tool_type``, from the app's own /metrics."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://app"
    ) as http:
        page = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "serve_app_tools_omitted_total" and sample.labels == {
                "tool": tool_type
            }:
                return sample.value
    return 0.0


@pytest.mark.parametrize("stream", [False, True])
async def test_codex_web_search_is_served_without_a_browser(
    recorded: FastAPI, stream: bool
) -> None:
    before = await omitted_count(recorded, "web_search")
    body = {"model": MODEL, "input": "hi", "tools": [FUNCTION, CODEX_WEB_SEARCH], "stream": stream}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=recorded), base_url="http://app"
    ) as http:
        answer = await http.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-serve-app-omitted-tools"] == "web_search"
    (prompt,) = recorded.state.prompts
    system = system_message(prompt)
    # Not offered the browser; told, in its system message, that web search is unavailable.
    assert "## browser" not in prompt and "namespace browser" not in prompt
    assert "You are ChatGPT, a large language model trained by OpenAI.\nWeb search is " \
        "unavailable on this server" in system  # fmt: skip
    assert "lookup" in prompt  # the tools it can use are still shown
    assert await omitted_count(recorded, "web_search") == before + 1
    if not stream:  # the tools echoed as sent
        assert answer.json()["tools"][1] == CODEX_WEB_SEARCH


async def test_without_a_web_search_tool_the_model_reads_no_note(recorded: FastAPI) -> None:
    client = sdk_client(recorded)
    answer = await client.responses.with_raw_response.create(
        model=MODEL, input="hi", tools=[FUNCTION]
    )
    assert "x-serve-app-omitted-tools" not in answer.headers
    assert "Web search" not in system_message(recorded.state.prompts[0])


async def test_background_and_token_counts_are_served_without_it_too(recorded: FastAPI) -> None:
    client = sdk_client(recorded)
    tools = [{"type": "web_search_preview"}, CODEX_WEB_SEARCH]
    started = await client.responses.with_raw_response.create(
        model=MODEL,
        input="hi",
        tools=tools,
        background=True,  # type: ignore[arg-type]
    )
    assert started.headers["x-serve-app-omitted-tools"] == "web_search_preview, web_search"
    bare = await client.responses.input_tokens.count(model=MODEL, input="hi")
    without = await client.responses.input_tokens.count(model=MODEL, input="hi", tools=tools)
    # The note's one line, once for both tools; never the browser's description (300+ tokens).
    assert 10 < without.input_tokens - bare.input_tokens < 40


async def test_a_tool_choice_forcing_a_search_it_cannot_run_is_a_400(
    bare: openai.AsyncOpenAI,
) -> None:
    error = await error_of(
        bare.responses.create(
            model=MODEL,
            input="hi",
            tools=[{"type": "web_search_preview"}],
            tool_choice={"type": "web_search_preview"},
        )
    )
    assert error["param"] == "tool_choice"
    assert "this server has no browser tool server" in error["message"]


async def test_over_a_websocket_the_model_is_not_offered_it(
    recorded: FastAPI,
) -> None:
    async with on_uvicorn(recorded) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
        async with client.responses.connect() as connection:
            await connection.response.create(
                model=MODEL,
                input="hi",
                tools=[CODEX_WEB_SEARCH],  # type: ignore[list-item]
            )
            events = []
            while not events or events[-1].type not in TERMINAL:
                events.append(await asyncio.wait_for(connection.recv(), 30))
    assert events[-1].type == "response.completed"
    assert "Web search is unavailable" in system_message(recorded.state.prompts[0])


async def test_a_container_other_than_auto_is_a_400(served: openai.AsyncOpenAI) -> None:
    tools = [{"type": "code_interpreter", "container": "cntr_abc"}]
    error = await error_of(served.responses.create(model=MODEL, input="hi", tools=tools))
    assert error["param"] == "tools[0].container"
    assert "cntr_abc" in error["message"]


async def test_with_their_servers_they_are_served_and_echoed(served: openai.AsyncOpenAI) -> None:
    tools = [
        {"type": "web_search"},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "code_interpreter", "container": "auto"},
    ]
    response = await served.responses.create(model=MODEL, input="hi", tools=tools)
    assert response.status == "completed"
    assert [tool.type for tool in response.tools] == [
        "web_search",
        "code_interpreter",
        "code_interpreter",
    ]
    bare = await served.responses.input_tokens.count(model=MODEL, input="hi")
    shown = await served.responses.input_tokens.count(model=MODEL, input="hi", tools=tools)
    assert shown.input_tokens > bare.input_tokens + 300  # the browser and python described
