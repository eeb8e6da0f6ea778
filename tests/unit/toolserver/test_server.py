"""The reference tool server as a client meets it: one MCP server with gpt-oss's tool names and
harmony's descriptions, on streamable HTTP and SSE, one namespace per server when asked for one
tool; loopback only unless told otherwise, and DNS-rebinding requests refused."""

from __future__ import annotations

import importlib
import logging
import tomllib
from pathlib import Path

import httpx
import pytest
import uvicorn
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from openai_harmony import ToolNamespaceConfig

from serve_app.toolserver import python_runner
from serve_app.toolserver.cli import main
from tests.support import REPO
from tests.support.toolserver import ToolServer, mcp_session, text_of, tool_server


async def test_one_server_lists_the_browser_and_python_tools(server: ToolServer) -> None:
    async with mcp_session(server.mcp_url) as session:
        init = await session.initialize()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert init.server_info.name == "gpt-oss-tools"
    assert "Tool for browsing." in init.instructions and "STATELESS" in init.instructions
    assert set(tools) == {"search", "open", "find", "python"}
    for trained in ToolNamespaceConfig.browser().tools:  # harmony's own words for each
        assert tools[trained.name].description == trained.description
        listed = tools[trained.name].input_schema["properties"]
        assert set(listed) <= set(trained.parameters["properties"]) | {"source"}
        assert set(tools[trained.name].input_schema.get("required", [])) == set(
            trained.parameters.get("required", [])
        )
    assert tools["python"].input_schema["required"] == ["code"]


async def test_sse_transport_serves_the_same_tools(server: ToolServer) -> None:
    async with sse_client(server.sse_url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("python", {"code": "print('over sse')"})
    assert text_of(result) == "over sse\n"


async def test_one_tool_is_one_namespace(docs: Path, hook_server: ToolServer) -> None:
    with tool_server(docs, "--tools", "browser") as browser_only:
        async with mcp_session(browser_only.mcp_url) as session:
            init = await session.initialize()
            names = {tool.name for tool in (await session.list_tools()).tools}
    assert (init.server_info.name, names) == ("browser", {"search", "open", "find"})
    async with mcp_session(hook_server.mcp_url) as session:
        init = await session.initialize()
        names = {tool.name for tool in (await session.list_tools()).tools}
    assert (init.server_info.name, names) == ("python", {"python"})


def test_a_request_for_another_host_is_refused(server: ToolServer) -> None:
    """DNS rebinding: a page on attacker.example resolving to 127.0.0.1 must not reach the tools."""
    client = {"name": "test", "version": "1"}
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
    accept = {"accept": "application/json, text/event-stream"}
    ours = server.url.removeprefix("http://")
    answers = {
        host: httpx.post(server.mcp_url, json=initialize, headers={**accept, "host": host})
        for host in (ours, "attacker.example")
    }
    assert answers[ours].status_code == 200
    assert answers["attacker.example"].status_code == 421


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--host", "0.0.0.0"], "is not loopback"),
        (["--tools", "browser,shell"], "--tools"),
        (["--tools", "browser"], "--docs DIR"),
    ],
)
def test_the_cli_refuses_what_it_should_not_serve(
    argv: list[str],
    complaint: str,
    docs: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def serve(*args: object, **kwargs: object) -> None:
        raise AssertionError("served what it should have refused")

    monkeypatch.setattr(uvicorn, "run", serve)
    with_docs = [] if argv == ["--tools", "browser"] else ["--docs", str(docs)]
    with pytest.raises(SystemExit) as exited:
        main([*with_docs, "--port", "1", *argv])
    assert exited.value.code == 2
    assert complaint in capsys.readouterr().err


def test_the_console_script_is_the_cli() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["serve-app-tools"].partition(":")
    assert getattr(importlib.import_module(module), function) is main


def test_without_a_sandbox_the_python_tool_refuses_to_start_unless_told(
    docs: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where bubblewrap cannot make its sandbox, `serve-app-tools` does not start its python
    tool (the browser alone still starts); `--python-sandbox none` starts it, said loudly."""
    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.append(app))
    monkeypatch.setattr(python_runner, "bwrap_works", lambda python: False)
    with pytest.raises(SystemExit) as exited:
        main(["--docs", str(docs), "--port", "1"])
    assert exited.value.code == 2 and not served
    refusal = capsys.readouterr().err
    assert "sandbox cannot be made here" in refusal and "--python-sandbox none" in refusal
    main(["--docs", str(docs), "--port", "1", "--tools", "browser"])
    caplog.set_level(logging.WARNING)
    main(["--docs", str(docs), "--port", "1", "--python-sandbox", "none"])
    assert len(served) == 2
    assert any("UNSANDBOXED" in record.getMessage() for record in caplog.records)
