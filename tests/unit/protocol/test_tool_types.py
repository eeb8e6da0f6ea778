"""The table of tool types (serve_app/protocol/tool_types.py) against the openai SDK's ``Tool``
union, and the door's answer for each row through the whole API in this process: every type the
SDK defines is named by the table (a type the SDK adds fails here until a row names it), a
refused type is OpenAI's 400 naming ``tools[i].type``, an unknown type too, a hosted
``tool_choice`` needs its tool, and the response echoes the tools as sent."""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from openai.types.responses import Tool
from pydantic import BaseModel

from serve_app.config import AppArgs, ToolArgs
from serve_app.protocol.builtin_tools import WEB_SEARCH_TYPES
from serve_app.protocol.tool_types import TOOL_TYPES, accepted, missing, omitted
from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client


def _sdk_tool_types() -> set[str]:
    """Every ``type`` value of the SDK's Tool union (dated aliases included)."""
    union = typing.get_args(Tool)[0]
    found: set[str] = set()
    for model in typing.get_args(union):
        assert issubclass(model, BaseModel)
        found.update(typing.get_args(model.model_fields["type"].annotation))
    return found


SDK_TYPES = sorted(_sdk_tool_types())
# A minimal body of each type, as a client sends it (the SDK's required fields).
BODIES: dict[str, dict[str, Any]] = {
    "function": {"type": "function", "name": "f", "parameters": {"type": "object"}},
    "custom": {"type": "custom", "name": "c"},
    "namespace": {"type": "namespace", "name": "n", "description": "", "tools": []},
    "tool_search": {"type": "tool_search"},
    "mcp": {"type": "mcp", "server_label": "s", "server_url": "http://127.0.0.1:9/mcp"},
    "code_interpreter": {"type": "code_interpreter", "container": {"type": "auto"}},
    "file_search": {"type": "file_search", "vector_store_ids": ["vs_1"]},
    "computer_use_preview": {
        "type": "computer_use_preview",
        "display_width": 1024,
        "display_height": 768,
        "environment": "linux",
    },
}


def test_the_table_names_every_type_of_the_sdks_union() -> None:
    assert set(SDK_TYPES) - set(TOOL_TYPES) == set(), "add a row to tool_types.TOOL_TYPES"
    assert set(TOOL_TYPES) - set(SDK_TYPES) == set(), "a row names no type of the SDK"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FastAPI]:
    async with in_process_api(tmp_path / "t.db") as app:
        yield app


async def _post(api: FastAPI, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        return await http.post("/v1/responses", json=body)


REFUSED = [
    name for name in SDK_TYPES if not accepted(name, AppArgs()) and not omitted(name, AppArgs())
]
# Sent by clients by default (Codex's web_search): served without when not configured.
OMITTED = [name for name in SDK_TYPES if omitted(name, AppArgs())]
STRICT = AppArgs(tools=ToolArgs(web_search_without_browser="refuse"))


def test_what_no_branch_handles_is_refused() -> None:
    assert {"file_search", "image_generation", "programmatic_tool_calling"} <= set(REFUSED)
    assert not {"function", "custom", "namespace", "tool_search"} & set(REFUSED)


@pytest.mark.parametrize("tool_type", REFUSED)
async def test_a_type_neither_shown_nor_run_is_refused(api: FastAPI, tool_type: str) -> None:
    tool = BODIES.get(tool_type, {"type": tool_type})
    body = {"model": MODEL, "input": "SDK-TEXT", "tools": [BODIES["function"], tool]}
    response = await _post(api, body)
    assert response.status_code == 400, response.text
    needs = missing(tool_type, AppArgs())  # gpt-oss's tools: the tool server it lacks
    assert response.json()["error"] == {
        "message": f"Tool '{tool_type}' is not supported with {MODEL}"
        + (f": this server has no {needs}." if needs else "."),
        "type": "invalid_request_error",
        "param": "tools[1].type",
        "code": None,
    }
    # The token count refuses it as well (it counts what the model is shown).
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        counted = await http.post("/v1/responses/input_tokens", json=body)
    assert counted.status_code == 400 and counted.json()["error"]["param"] == "tools[1].type"


def test_only_the_web_search_types_are_served_without_by_default() -> None:
    assert sorted(WEB_SEARCH_TYPES) == OMITTED
    assert [name for name in SDK_TYPES if omitted(name, STRICT)] == []


@pytest.mark.parametrize("tool_type", OMITTED)
async def test_a_type_served_without_is_left_out_and_said(api: FastAPI, tool_type: str) -> None:
    body = {"model": MODEL, "input": "SDK-TEXT", "tools": [BODIES["function"], {"type": tool_type}]}
    response = await _post(api, body)
    assert response.status_code == 200, response.text
    assert response.headers["x-serve-app-omitted-tools"] == tool_type
    assert [tool["type"] for tool in response.json()["tools"]] == ["function", tool_type]


@pytest.mark.parametrize("tool_type", OMITTED)
async def test_an_operator_who_wants_the_strict_answer_refuses_them(
    tmp_path: Path, tool_type: str
) -> None:
    body = {"model": MODEL, "input": "SDK-TEXT", "tools": [BODIES["function"], {"type": tool_type}]}
    async with in_process_api(tmp_path / "strict.db", STRICT) as strict:
        response = await _post(strict, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools[1].type"
    # The operator's remedy, then the client's.
    assert "(the operator sets tools.browser_server_url)" in error["message"]
    assert 'Codex: web_search = "disabled"' in error["message"]


async def test_an_unknown_type_is_refused(api: FastAPI) -> None:
    response = await _post(api, {"model": MODEL, "input": "hi", "tools": [{"type": "teleport"}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tools[0].type" and error["code"] == "invalid_value"
    assert error["message"].startswith("Invalid value: 'teleport'. Supported values are:")


@pytest.mark.parametrize("choice", ["file_search", "image_generation", "web_search_preview"])
async def test_a_hosted_tool_choice_needs_its_tool(api: FastAPI, choice: str) -> None:
    body = {
        "model": MODEL,
        "input": "hi",
        "tools": [BODIES["function"]],
        "tool_choice": {"type": choice},
    }
    response = await _post(api, body)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"Tool choice '{choice}' not found in 'tools' parameter."
    )
    assert response.json()["error"]["param"] == "tool_choice"


async def test_the_response_echoes_every_tool_as_sent(api: FastAPI) -> None:
    # What the default app shows or runs (gpt-oss's tools need tool servers it does not name).
    shown = [name for name in SDK_TYPES if accepted(name, AppArgs())]
    # An mcp tool is listed from its server before the model runs: its echo is
    # tests/unit/protocol/test_mcp_items.py's (without its credentials).
    tools = [BODIES[name] for name in shown if name in BODIES and name != "mcp"]
    tools.append({**BODIES["function"], "name": "later", "defer_loading": True})
    response = await sdk_client(api).responses.create(
        model=MODEL,
        input="SDK-TEXT",
        tools=tools,  # type: ignore[arg-type]
    )
    assert [tool.type for tool in response.tools] == [tool["type"] for tool in tools]
    assert response.tools[-1].defer_loading is True  # type: ignore[union-attr]


async def test_the_sdk_sees_the_refusal(api: FastAPI) -> None:
    with pytest.raises(openai.BadRequestError, match="Tool 'image_generation' is not supported"):
        await sdk_client(api).responses.create(
            model=MODEL, input="hi", tools=[{"type": "image_generation"}]
        )
