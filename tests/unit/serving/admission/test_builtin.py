"""The door on gpt-oss's own tools, through the openai SDK on the in-process API: without the
tool server that runs it, a web_search or code_interpreter tool is a 400 naming
``tools[i].type`` (on ``/input_tokens`` too); a container other than ``auto`` is a 400 naming
``tools[i].container``; with the servers named, the request is served."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from serve_app.config import AppArgs, ToolArgs
from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client

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


@pytest.mark.parametrize(
    ("tools", "param", "tool_type"),
    [
        ([FUNCTION, {"type": "web_search"}], "tools[1].type", "web_search"),
        ([{"type": "web_search_preview"}], "tools[0].type", "web_search_preview"),
        ([{"type": "code_interpreter", "container": {"type": "auto"}}], "tools[0].type",
         "code_interpreter"),
    ],
)  # fmt: skip
async def test_a_tool_without_its_server_is_a_400(
    bare: openai.AsyncOpenAI, tools: list[dict], param: str, tool_type: str
) -> None:
    body = {"model": MODEL, "input": "hi", "tools": tools}
    for call in (bare.responses.create(**body), bare.responses.input_tokens.count(**body)):
        error = await error_of(call)
        assert error["param"] == param and error["code"] is None
        assert error["message"].startswith(f"Tool '{tool_type}' is not supported with {MODEL}")
        assert "tool server (the operator sets tools." in error["message"]


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
