"""The MCP client against real MCP servers (the `mcp` SDK's own server classes, in
subprocesses on loopback: tests/support/mcp_servers.py), good and bad: every failure is a
value within its bound, never an exception, a hang or a leaked credential."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Iterator

import pytest
from openai.types.responses.mcp_tool_call_error import (
    HTTPError,
    McpProtocolError,
    McpToolExecutionError,
)

from serve_app.config import ToolArgs
from serve_app.serving.tools.mcp import McpClient, McpServer
from serve_app.serving.tools.mcp.client import _describe, _Failed, _protocol_error
from serve_app.serving.tools.mcp.servers import Slots
from serve_app.serving.tools.mcp.transport import Guard
from tests.support.mcp_servers import McpTestServer, mcp_server

TOKEN = "tok-7f3a9c-secret"


def _client(server: McpTestServer, **bounds: float) -> McpClient:
    return McpClient(ToolArgs(mcp_allow=[server.origin], **bounds))


@pytest.fixture(scope="module", params=["streamable-http", "sse"])
def good(request: pytest.FixtureRequest) -> Iterator[McpTestServer]:
    with mcp_server("good", request.param) as server:
        yield server


@pytest.fixture(scope="module")
def good_json() -> Iterator[McpTestServer]:
    with mcp_server("good", json_response=True) as server:
        yield server


async def test_lists_tools_with_their_schemas(good: McpTestServer) -> None:
    listing = await _client(good).list_tools(McpServer(good.url))
    assert listing.error is None
    tools = {tool.name: tool for tool in listing.tools}
    assert set(tools) == {"echo", "add", "slow", "fail", "seen_headers", "charge", "charges"}
    assert tools["add"].description == "Adds two integers."
    schema = tools["add"].input_schema
    assert isinstance(schema, dict)
    assert schema["required"] == ["a", "b"] and schema["properties"]["a"]["type"] == "integer"


async def test_calls_a_tool_with_arguments_as_the_model_wrote_them(good: McpTestServer) -> None:
    client = _client(good)
    echoed = await client.call_tool(McpServer(good.url), "echo", '{"text": "hello"}')
    assert (echoed.output, echoed.error) == ("hello", None)
    added = await client.call_tool(McpServer(good.url), "add", {"a": 2, "b": 40})
    assert added.output == "42" and added.message == "42"


async def test_a_json_response_server_works_too(good_json: McpTestServer) -> None:
    outcome = await _client(good_json).call_tool(McpServer(good_json.url), "echo", {"text": "json"})
    assert outcome.output == "json"


async def test_a_failing_tool_is_an_execution_error(good: McpTestServer) -> None:
    client = _client(good)
    failed = await client.call_tool(McpServer(good.url), "fail", {"message": "boom"})
    assert isinstance(failed.error, McpToolExecutionError) and failed.output is None
    assert failed.message == "Error executing tool fail: boom"  # the SDK server's wording
    assert failed.error.content == [{"type": "text", "text": failed.message}]
    unknown = await client.call_tool(McpServer(good.url), "no_such_tool", {})
    assert unknown.error is not None and "no_such_tool" in unknown.message


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", '"text"'])
async def test_bad_arguments_fail_without_a_connection(arguments: str) -> None:
    client = McpClient(ToolArgs(mcp_allow=["http://127.0.0.1:9"]))  # nothing listens there
    outcome = await client.call_tool(McpServer("http://127.0.0.1:9/mcp"), "echo", arguments)
    assert isinstance(outcome.error, McpProtocolError) and outcome.error.code == -32602
    assert "arguments" in outcome.message


async def test_a_url_no_longer_allowed_is_not_reached(good: McpTestServer) -> None:
    client = McpClient(ToolArgs(mcp_allow=["https://elsewhere.example/"]))
    outcome = await client.call_tool(McpServer(good.url), "echo", {"text": "x"})
    assert outcome.error is not None and "tools.mcp_allow" in outcome.message
    listing = await client.list_tools(McpServer(good.url))
    assert listing.error is not None and not listing.tools


async def test_headers_go_to_their_server_only(good: McpTestServer) -> None:
    with mcp_server("good") as other:
        client = McpClient(ToolArgs(mcp_allow=[good.origin, other.origin]))
        mine = McpServer.for_tool(good.url, {"X-Tenant": "t1"}, authorization=TOKEN)
        seen = await client.call_tool(mine, "seen_headers", {})
        assert f"authorization: Bearer {TOKEN}" in json.loads(seen.output or "[]")
        assert "x-tenant: t1" in json.loads(seen.output or "[]")
        elsewhere = await client.call_tool(McpServer(other.url), "seen_headers", {})
        assert json.loads(elsewhere.output or "null") == []


async def test_routing_headers_never_leave_even_past_the_door() -> None:
    """The door refuses them (a 400); a server built around it anyway (a stored or background
    request, a bug) still sends its own Host and no client's routing header."""
    with mcp_server("good") as server:
        client = McpClient(ToolArgs(mcp_allow=[server.origin]))
        forged = {
            "Host": "admin.internal",
            "X-Forwarded-Host": "admin.internal",
            "Forwarded": "host=admin.internal",
            "Connection": "close, X-Tenant",
            "X-Tenant": "t1",
        }
        seen = await client.call_tool(McpServer.for_tool(server.url, forged), "seen_headers", {})
    assert json.loads(seen.output or "null") == ["x-tenant: t1"]


async def test_a_token_is_never_logged_nor_in_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with mcp_server("good", token="the-right-one") as guarded, mcp_server("drop") as drop:
        client = McpClient(ToolArgs(mcp_allow=[guarded.origin, drop.origin], mcp_call_timeout_s=10))
        refused = await client.call_tool(
            McpServer.for_tool(guarded.url, authorization=TOKEN), "echo", {"text": "x"}
        )
        assert isinstance(refused.error, HTTPError) and refused.error.code == 401
        listing = await client.list_tools(McpServer.for_tool(guarded.url, {"X-Api-Key": TOKEN}))
        assert listing.error is not None
        dropped = await client.call_tool(
            McpServer.for_tool(drop.url, authorization=TOKEN), "drop", {}
        )
        assert dropped.error is not None
        right = McpServer.for_tool(guarded.url, authorization="the-right-one")
        assert (await client.call_tool(right, "echo", {"text": "ok"})).output == "ok"
    for text in (refused.message, listing.error, dropped.message, repr(right)):
        assert TOKEN not in text and "the-right-one" not in text
    assert caplog.records, "the SDK and httpx log at DEBUG: the capture must have seen them"
    assert TOKEN not in caplog.text and "the-right-one" not in caplog.text
    for record in caplog.records:
        assert TOKEN not in repr(record.args) and "the-right-one" not in repr(record.args)


async def test_a_token_a_server_echoes_in_its_error_is_blanked(good: McpTestServer) -> None:
    server = McpServer.for_tool(good.url, authorization=TOKEN)
    echoed = await _client(good).call_tool(server, "fail", {"message": f"you sent Bearer {TOKEN}"})
    assert isinstance(echoed.error, McpToolExecutionError)
    assert echoed.message.endswith("you sent [redacted]")


async def test_a_hanging_call_fails_within_its_timeout() -> None:
    with mcp_server("hang") as hang:
        client = _client(hang, mcp_call_timeout_s=1.5)
        started = time.monotonic()
        outcome = await client.call_tool(McpServer(hang.url), "hang", {})
        elapsed = time.monotonic() - started
    assert isinstance(outcome.error, McpProtocolError) and outcome.error.code == -32001
    assert "1.5s" in outcome.message
    assert 1.4 < elapsed < 6  # the bound, and a margin for a loaded machine


@pytest.mark.parametrize("operation", ["list", "call"])
async def test_a_server_that_never_answers_fails_within_the_connect_timeout(operation: str) -> None:
    with mcp_server("silent") as silent:
        client = _client(
            silent, mcp_connect_timeout_s=1, mcp_call_timeout_s=30, mcp_list_timeout_s=30
        )
        started = time.monotonic()
        if operation == "list":
            error = (await client.list_tools(McpServer(silent.url))).error
        else:
            error = (await client.call_tool(McpServer(silent.url), "echo", {"text": "x"})).message
        elapsed = time.monotonic() - started
    assert error and "in time" in error
    assert elapsed < 8  # the connect timeout (1 s), far below the operation's (30 s)


async def test_an_unreachable_server_fails_at_once() -> None:
    client = McpClient(ToolArgs(mcp_allow=["http://127.0.0.1:9"]))
    outcome = await client.call_tool(McpServer("http://127.0.0.1:9/mcp"), "echo", {"text": "x"})
    assert isinstance(outcome.error, McpProtocolError) and "could not reach" in outcome.message


@pytest.mark.parametrize(
    ("transport", "json_response"),
    [("streamable-http", False), ("streamable-http", True), ("sse", False)],
)
async def test_a_10_mib_result_is_refused_with_a_clear_error(
    transport: str, json_response: bool
) -> None:
    with mcp_server("huge", transport, json_response=json_response) as huge:  # type: ignore[arg-type]
        client = _client(huge, mcp_call_timeout_s=20)
        started = time.monotonic()
        outcome = await client.call_tool(McpServer(huge.url), "huge", {"mib": 10})
        elapsed = time.monotonic() - started
        assert (
            await client.call_tool(McpServer(huge.url), "echo", {"text": "after"})
        ).output == "after"
    assert outcome.output is None and isinstance(outcome.error, McpProtocolError)
    assert "exceeded" in outcome.message and "byte" in outcome.message
    assert elapsed < 10


async def test_a_result_over_the_output_bound_is_refused() -> None:
    with mcp_server("huge") as huge:
        client = _client(huge, mcp_max_output_bytes=100_000)
        outcome = await client.call_tool(McpServer(huge.url), "huge", {"mib": 0.5})
        small = await client.call_tool(McpServer(huge.url), "huge", {"mib": 0.05})
    assert outcome.error is not None and "524288 bytes, more than the 100000" in outcome.message
    assert small.output is not None and len(small.output) == int(0.05 * 1024 * 1024)


async def test_an_error_result_is_held_to_the_output_bound_too() -> None:
    """An ``isError`` result is text the model reads as well: 3 MB passed a 1 KiB bound."""
    with mcp_server("good") as server:
        client = _client(server, mcp_max_output_bytes=1024)
        outcome = await client.call_tool(McpServer(server.url), "fail", {"message": "e" * 300_000})
    assert isinstance(outcome.error, McpProtocolError)
    assert "bytes, more than the 1024" in outcome.message
    assert "eeee" not in outcome.message


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_a_server_closing_mid_call_is_an_error_at_once(transport: str) -> None:
    with mcp_server("drop", transport) as drop:  # type: ignore[arg-type]
        client = _client(drop, mcp_call_timeout_s=30)
        started = time.monotonic()
        outcome = await client.call_tool(McpServer(drop.url), "drop", {})
        elapsed = time.monotonic() - started
        assert drop.process.wait(timeout=10) == 3  # it did end mid-call (os._exit(3))
    assert outcome.output is None and isinstance(outcome.error, McpProtocolError)
    assert elapsed < 10


async def test_a_server_listing_500_tools_is_listed_and_a_bound_refuses_more() -> None:
    with mcp_server("many") as many:
        listing = await _client(many).list_tools(McpServer(many.url))
        bounded = await _client(many, mcp_max_tools=100).list_tools(McpServer(many.url))
    assert listing.error is None and len(listing.tools) == 500
    assert listing.tools[499].name == "tool_499"
    assert bounded.error is not None and "more than 100 tools" in bounded.error


async def test_calls_to_one_server_are_bounded() -> None:
    with mcp_server("good") as server:
        client = _client(server, mcp_max_concurrent_calls=2)
        target = McpServer(server.url)
        seen: list[int] = []

        async def watch() -> None:
            while True:
                seen.append(client.calls_in_flight(target))
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(client.call_tool(target, "slow", {"seconds": 0.5}) for _ in range(6))
        )
        elapsed = time.monotonic() - started
        watcher.cancel()
    assert [outcome.output for outcome in outcomes] == ["slept 0.5s"] * 6
    assert max(seen) == 2 and client.calls_in_flight(target) == 0
    assert elapsed >= 1.5  # three rounds of two


async def test_cancelling_the_caller_cancels_the_call() -> None:
    with mcp_server("good") as server:
        client = _client(server, mcp_call_timeout_s=60)
        target = McpServer(server.url)
        call = asyncio.create_task(client.call_tool(target, "slow", {"seconds": 30}))
        while not client.calls_in_flight(target):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        started = time.monotonic()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert time.monotonic() - started < 5  # at once, not after the call's 30 s
        assert client.calls_in_flight(target) == 0
        # The server is fine, and so is the client.
        assert (await client.call_tool(target, "echo", {"text": "again"})).output == "again"


# The bound on calls in flight per server (and credentials): never more than the limit at once,
# whatever order calls arrive, finish or are cancelled in (waiting or running), and nothing kept
# for a server once its calls are done.

LIMIT = 3
KEYS = ("a", "b", "c")


async def _interleaving(seed: int) -> None:
    rng = random.Random(seed)
    slots = Slots(LIMIT)
    inside = dict.fromkeys(KEYS, 0)
    worst = dict.fromkeys(KEYS, 0)

    async def call(key: str) -> None:
        async with slots.hold(key):
            inside[key] += 1
            worst[key] = max(worst[key], inside[key])
            assert slots.active(key) == inside[key]
            try:
                for _ in range(rng.randint(0, 3)):
                    await asyncio.sleep(0)
            finally:
                inside[key] -= 1

    tasks = []
    for _ in range(120):
        tasks.append(asyncio.create_task(call(rng.choice(KEYS))))
        for _ in range(rng.randint(0, 2)):
            await asyncio.sleep(0)
        if rng.random() < 0.3:  # cancel one: waiting for a slot, holding one, or done
            rng.choice(tasks).cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert all(count <= LIMIT for count in worst.values())
    assert max(worst.values()) == LIMIT  # the bound was reached, so it was tested
    assert slots._semaphores == {} and slots._active == {}


@pytest.mark.parametrize("seed", range(25))
async def test_the_bound_holds_under_any_interleaving(seed: int) -> None:
    await _interleaving(seed)


def test_a_server_key_separates_credentials_and_shows_none() -> None:
    url = "https://a.example.com/mcp"
    one = McpServer.for_tool(url, authorization="secret-one")
    two = McpServer.for_tool(url, authorization="secret-two")
    assert one.key != two.key and one.key == McpServer.for_tool(url, authorization="secret-one").key
    assert one.key.startswith(url) and "secret" not in one.key
    assert "secret" not in repr(one)
    assert one.headers == {"Authorization": "Bearer secret-one"}
    assert one.redact("the server said: Bearer secret-one") == "the server said: [redacted]"


def test_authorization_replaces_a_header_of_that_name() -> None:
    server = McpServer.for_tool("https://a.example/mcp", {"authorization": "x", "X-A": "b"}, "tok")
    assert server.headers == {"X-A": "b", "Authorization": "Bearer tok"}


@pytest.mark.parametrize(
    ("url", "transport"),
    [
        ("https://a.example/sse", "sse"),
        ("https://a.example/v1/sse/", "sse"),
        ("https://a.example/mcp", "streamable_http"),
        ("https://a.example/ssex", "streamable_http"),
        ("https://a.example/", "streamable_http"),
    ],
)
def test_the_transport_is_chosen_by_the_url(url: str, transport: str) -> None:
    assert McpServer(url).transport == transport


def test_a_failure_a_task_group_wrapped_keeps_its_description() -> None:
    failure = _Failed(_protocol_error(-32603, "the MCP server lists more than 5 tools"))
    group = ExceptionGroup("closing", [ConnectionResetError("reset"), failure])
    assert _describe(group, Guard(), McpServer("http://127.0.0.1:9/mcp")) == failure.error
