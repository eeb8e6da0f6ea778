"""The runners of gpt-oss's browser and python against the reference tool server
(serve_app/toolserver, a process on loopback), as the tool loop calls them: what the model reads
next, and what the web_search_call / code_interpreter_call items are told."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from serve_app.config import ToolArgs
from serve_app.harmony.tools import ToolSpec
from serve_app.protocol import builtin_items
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.tools.builtin import BuiltinToolRunner, register_builtin_runners
from serve_app.serving.tools.contract import CancelScope, ToolCall, ToolRunners
from tests.support import MODEL
from tests.support.serve_run import free_port
from tests.support.toolserver import ToolServer, tool_server

ZEBRA = "# Zebras\n\nZebras have black and white stripes.\n\nSee [horses](horses.md).\n"
HORSES = "# Horses\n\nHorses gallop across the plains.\n"
ZEBRA_URL = "http://docs.local/zebra.md"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolServer]:
    docs = tmp_path_factory.mktemp("docs")
    (docs / "zebra.md").write_text(ZEBRA)
    (docs / "horses.md").write_text(HORSES)
    with tool_server(docs, "--python-wall-seconds", "5") as running:
        yield running


def browser_spec(name: str) -> ToolSpec:
    return ToolSpec(name=name, kind="browser", namespace="browser")


PYTHON = ToolSpec(name="python", kind="python")


def call(spec: ToolSpec, arguments: str, response_id: str = "resp_1", **request) -> ToolCall:
    body = {"model": MODEL, "input": "hi", **request}
    return ToolCall(
        spec=spec,
        arguments=arguments,
        owner=None,
        request=ResponsesRequest.model_validate(body),
        item_id="ws_1",
        call_id="call_1",
        scope=CancelScope(),
        response_id=response_id,
    )


def runner(kind: str, url: str, **args) -> BuiltinToolRunner:
    return BuiltinToolRunner(kind, url, ToolArgs(**args))


async def test_search_then_open_a_result_then_find_in_one_response(server: ToolServer) -> None:
    browser = runner("browser", server.mcp_url)
    searched = await browser.run(call(browser_spec("search"), '{"query": "zebra stripes"}'))
    assert not searched.failed
    assert "【0†Zebras†docs.local】" in searched.output
    # The result's link id on the search page: the same response's session has that page.
    opened = await browser.run(call(browser_spec("open"), '{"id": 0, "cursor": 0}'))
    assert opened.output.startswith(f"[1] Zebras ({ZEBRA_URL})")
    assert opened.data == {builtin_items.URL: ZEBRA_URL}
    found = await browser.run(call(browser_spec("find"), '{"pattern": "stripes"}'))
    assert not found.failed and "stripes" in found.output
    assert found.data == {builtin_items.URL: ZEBRA_URL}


async def test_a_searchs_sources_when_the_request_includes_them(server: ToolServer) -> None:
    browser = runner("browser", server.mcp_url)
    plain = await browser.run(call(browser_spec("search"), '{"query": "zebra stripes"}'))
    assert plain.data == {}
    include = ["web_search_call.action.sources"]
    searched = await browser.run(
        call(browser_spec("search"), '{"query": "zebra stripes"}', "resp_s", include=include)
    )
    assert searched.data[builtin_items.SOURCES][0] == ZEBRA_URL


async def test_each_response_has_its_own_pages(server: ToolServer) -> None:
    browser = runner("browser", server.mcp_url)
    await browser.run(call(browser_spec("search"), '{"query": "zebra"}', "resp_a"))
    other = await browser.run(call(browser_spec("open"), '{"id": 0}', "resp_b"))
    assert other.failed and "No pages to access" in (other.error or "")


async def test_bad_arguments_and_refusals_are_errors_the_model_reads(server: ToolServer) -> None:
    browser = runner("browser", server.mcp_url)
    bad = await browser.run(call(browser_spec("search"), "not json"))
    assert bad.error == "The arguments of browser.search must be a JSON object."
    refused = await browser.run(call(browser_spec("open"), '{"id": 7, "cursor": 9}', "resp_x"))
    assert refused.failed and refused.model_text.startswith("Error: ")


async def test_python_runs_and_its_logs_are_outputs_only_when_included(server: ToolServer) -> None:
    python = runner("python", server.mcp_url)
    plain = await python.run(call(PYTHON, "print(6 * 7)"))
    assert plain.output.strip() == "42" and plain.data == {}
    included = await python.run(
        call(PYTHON, "print(6 * 7)", include=["code_interpreter_call.outputs"])
    )
    assert included.data == {builtin_items.LOGS: included.output}
    failing = await python.run(call(PYTHON, "1 / 0"))
    assert "ZeroDivisionError" in failing.model_text


async def test_an_unreachable_server_is_a_failed_call_not_an_exception() -> None:
    python = runner("python", f"http://127.0.0.1:{free_port()}/mcp", mcp_connect_timeout_s=2)
    result = await asyncio.wait_for(python.run(call(PYTHON, "print(1)")), 30)
    assert (result.error or "").startswith("could not reach the MCP server")


async def test_a_slow_call_times_out(server: ToolServer) -> None:
    python = runner("python", server.mcp_url, mcp_call_timeout_s=1)
    result = await python.run(call(PYTHON, "import time; time.sleep(4)"))
    assert result.error == "the MCP server did not answer within 1s"


async def test_an_output_beyond_the_bound_fails_the_call(server: ToolServer) -> None:
    python = runner("python", server.mcp_url, mcp_max_output_bytes=100)
    result = await python.run(call(PYTHON, "print('x' * 500)"))
    assert (result.error or "").endswith("more than the 100 this server passes on")


async def test_over_sse_and_whatever_the_mcp_allowlist_says(
    server: ToolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's tool server is reached though requests' `mcp` tools may reach elsewhere.
    monkeypatch.setenv("SERVE_APP_MCP_ALLOW", "https://mcp.example.com/")
    python = runner("python", server.sse_url)
    assert (await python.run(call(PYTHON, "print('over sse')"))).output == "over sse\n"


async def test_the_operators_server_is_reached_at_the_name_it_wrote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tool server named by a name that resolves to a private or loopback address (a
    cluster Service, a sidecar) is connected to: here a closed loopback port, so the call
    fails reaching it, not by the policy refusing the address before any connection."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return real("127.0.0.1" if host == "serve-app-python" else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    python = runner("python", f"http://serve-app-python:{free_port()}/mcp")
    result = await asyncio.wait_for(python.run(call(PYTHON, "print(1)")), 30)
    assert (result.error or "").startswith("could not reach the MCP server"), result.error


def test_runners_are_registered_for_the_servers_the_operator_named() -> None:
    runners = ToolRunners()
    register_builtin_runners(runners, ToolArgs())
    assert list(runners) == []
    register_builtin_runners(runners, ToolArgs(python_server_url="http://127.0.0.1:1/mcp"))
    assert list(runners) == ["python"]
    assert runners.runs("python") and runners.runs("browser")  # their items are registered
