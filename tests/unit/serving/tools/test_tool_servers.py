"""One seam for every tool the server runs (issue 46): a `ToolServer` (has, describe, session:
serve_app/serving/tools/contract.py) for MCP, gpt-oss's browser and python, tool_search and
the tests' echo; a response runs its calls of a server in one session, closed at its end; the
tool registry is built once, at the door, and required after it.
"""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.config import AppArgs, ToolArgs
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.errors import ServerError
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.tools.builtin import register_builtin_runners
from serve_app.serving.tools.contract import ToolContext, ToolRunners
from serve_app.serving.tools.mcp_trust import TrustedMcp
from serve_app.serving.turn.rendering import Renderer
from serve_app.serving.turn.state import Context
from tests.support import MODEL
from tests.support.echo_tool import EchoRunner, EchoServer, echo_runners
from tests.support.helpers import in_process_api, sdk_client

TWO_ECHOES = {
    "turns": [
        {"match": "echo: second", "items": [{"text": "Both echoed."}]},
        {
            "match": "echo: first",
            "items": [
                {
                    "function_call": {
                        "namespace": "testtools",
                        "name": "echo",
                        "arguments": {"text": "second"},
                    }
                }
            ],
        },
        {
            "match": "ECHO-TWICE",
            "items": [
                {
                    "function_call": {
                        "namespace": "testtools",
                        "name": "echo",
                        "arguments": {"text": "first"},
                    }
                }
            ],
        },
    ]
}


async def test_a_responses_calls_of_a_server_run_in_one_session_closed_at_its_end(
    tmp_path,
) -> None:
    runners = echo_runners(EchoRunner())
    (server,) = runners.servers
    assert isinstance(server, EchoServer)
    engine = SimulatedEngineConfig(script=TWO_ECHOES, decode_tokens_per_s=50_000)
    async with in_process_api(tmp_path / "s.db", engine=engine, tools=runners) as api:
        client = sdk_client(api)
        first = await client.responses.create(model=MODEL, input="ECHO-TWICE")
        second = await client.responses.create(model=MODEL, input="ECHO-TWICE")
    assert first.output_text == second.output_text == "Both echoed."
    assert [(s.response_id, s.calls, s.closed) for s in server.sessions] == [
        (first.id, 2, True),
        (second.id, 2, True),
    ]


def request_with(*tools: dict[str, Any]) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": MODEL, "input": "hi", "tools": list(tools)})


async def test_every_kind_the_server_runs_is_a_tool_servers() -> None:
    """The app's servers: MCP, tool_search, and the browser and python the operator named;
    each says which requests it serves, describes, and opens a session."""
    args = AppArgs.model_validate(
        {
            "tools": {
                "mcp_allow": ["http://127.0.0.1:9"],
                "browser_server_url": "http://127.0.0.1:1/mcp",
                "python_server_url": "http://127.0.0.1:1/mcp",
            }
        }
    )
    async with in_process_api("sqlite+aiosqlite:///:memory:", args) as api:
        runners: ToolRunners = api.state.service.tools
        kinds = {"mcp", "mcp_approval", "tool_search", "tool_search_client", "browser", "python"}
        assert kinds <= set(runners)
        asked = {
            "mcp": {"type": "mcp", "server_label": "d", "server_url": "http://127.0.0.1:9/mcp"},
            "tool_search": {"type": "tool_search"},
            "browser": {"type": "web_search"},
            "python": {"type": "code_interpreter", "container": {"type": "auto"}},
        }
        for kind, tool in asked.items():
            server = runners.server(kind)
            assert server is not None and kind in server.kinds
            assert server.has(request_with(tool)) and not server.has(request_with())
            context = ToolContext(request_with(tool), [], None, TrustedMcp())
            description = await server.describe(context)
            assert list(description.specs) == []  # none listed yet (MCP), or the request's own
            session = server.session(None, "resp_1")
            await session.aclose()


async def test_the_registry_is_built_once_per_response_and_required_after_the_door(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[ResponsesRequest] = []
    original = ToolRegistry.from_request.__func__  # type: ignore[attr-defined]

    def counted(cls: type[ToolRegistry], request: ResponsesRequest, *args: Any, **kw: Any):
        built.append(request)
        return original(cls, request, *args, **kw)

    monkeypatch.setattr(ToolRegistry, "from_request", classmethod(counted))
    tools = [
        {"type": "function", "name": "f", "defer_loading": True, "parameters": {"type": "object"}},
        {"type": "tool_search"},
    ]
    async with in_process_api(tmp_path / "s.db", tools=echo_runners()) as api:
        client = sdk_client(api)
        await client.responses.create(model=MODEL, input="hi", tools=tools)
        assert len(built) == 1
        await client.responses.input_tokens.count(model=MODEL, input="hi", tools=tools)
        assert len(built) == 2
        # Past the door, a context without its registry is an error (logged), never a new one.
        renderer: Renderer = api.state.service._renderer
        context = Context(request_with(), [])
        with pytest.raises(ServerError):
            await renderer.render(context, None, truncate=True)
    assert len(built) == 2


def test_builtin_servers_are_registered_for_the_servers_the_operator_named() -> None:
    runners = ToolRunners()
    assert register_builtin_runners(runners, ToolArgs()) == []
    (client,) = register_builtin_runners(
        runners, ToolArgs(python_server_url="http://127.0.0.1:1/mcp")
    )
    # The operator's server is its client's one entry; requests' `mcp_allow` is never its.
    assert list(runners) == ["python"] and client.args.mcp_allow == []
