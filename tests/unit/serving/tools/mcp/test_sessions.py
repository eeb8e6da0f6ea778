"""MCP sessions that last (issue 46): one session per (owner, server URL, headers) for every
operation, reused within `ToolArgs.mcp_session_ttl_s`, never shared across owners, ended (its
``DELETE``) once idle past the TTL and when the client closes; the bound on calls in flight
counts per (server, credentials, owner), never per any other header.

Against the ``good`` test MCP server (tests/support/mcp_servers.py), which reports the
``mcp-session-id``s it saw and those ended; and through the whole app in this process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from openai.types.responses.response_output_item import McpListToolsTool

from serve_app.config import AppArgs, ToolArgs
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.serving.http.auth import ApiKeys
from serve_app.serving.tools.mcp.client import ListOutcome, McpClient, McpServer
from tests.support import API_KEY, MODEL, OTHER_API_KEY
from tests.support.helpers import in_process_api, sdk_client
from tests.support.mcp_servers import McpTestServer, mcp_server


@pytest.fixture(scope="module")
def good() -> McpTestServer:
    with mcp_server("good") as server:
        yield server


@asynccontextmanager
async def client_of(server: McpTestServer, **bounds: Any) -> AsyncIterator[McpClient]:
    client = McpClient(ToolArgs(mcp_allow=[server.origin], **bounds))
    try:
        yield client
    finally:
        await client.aclose()


def new_sessions(server: McpTestServer, before: set[str]) -> set[str]:
    return server.session_stats()[0] - before


async def test_one_owners_operations_share_one_session(good) -> None:
    before, _ = good.session_stats()
    async with client_of(good) as client:
        server = McpServer(good.url, owner="alice")
        listed = await client.list_tools(server)
        first = await client.call_tool(server, "echo", {"text": "one"})
        second = await client.call_tool(server, "echo", {"text": "two"})
        together = await asyncio.gather(
            *(client.call_tool(server, "echo", {"text": str(i)}) for i in range(4))
        )
        assert listed.error is None and (first.output, second.output) == ("one", "two")
        assert [outcome.output for outcome in together] == ["0", "1", "2", "3"]
        assert len(new_sessions(good, before)) == 1


async def test_a_session_the_restarted_server_forgot_is_replaced_once() -> None:
    # A server restarted at the same URL answers the old session's id with 404 ("Session not
    # found" from the SDK's server): the operation is run again on a new session, not failed.
    # (The Agents SDKs' approval tests start their own server per test on one allowlisted port.)
    with mcp_server("good") as first:
        port = first.port
        async with client_of(first) as client:
            server = McpServer(first.url, owner="alice")
            assert (await client.call_tool(server, "echo", {"text": "one"})).output == "one"
            old, _ = first.session_stats()
            first.stop()
            with mcp_server("good", port=port) as restarted:
                listed = await client.list_tools(server)
                called = await client.call_tool(server, "echo", {"text": "two"})
                assert listed.error is None, listed.error
                assert called.output == "two", called
                # The old id once (its 404), then one new session for both operations.
                assert len(restarted.session_stats()[0] - old) == 1


async def test_owners_and_credentials_never_share_a_session(good) -> None:
    before, _ = good.session_stats()
    async with client_of(good) as client:
        for server in (
            McpServer(good.url, owner="alice"),
            McpServer(good.url, owner="bob"),
            McpServer(good.url, owner=None),
            McpServer(good.url, {"Authorization": "Bearer other"}, owner="alice"),
        ):
            assert (await client.call_tool(server, "echo", {"text": "x"})).output == "x"
        assert len(new_sessions(good, before)) == 4


async def test_a_session_ends_once_idle_past_its_ttl_and_all_end_on_close(good) -> None:
    before, ended_before = good.session_stats()
    async with client_of(good, mcp_session_ttl_s=0.3) as client:
        server = McpServer(good.url, owner="alice")
        await client.call_tool(server, "echo", {"text": "x"})
        (first,) = new_sessions(good, before)
        await asyncio.sleep(1.2)  # past the TTL, and the sweep after it
        assert first in good.session_stats()[1]
        await client.call_tool(server, "echo", {"text": "y"})
        (second,) = new_sessions(good, before | {first})
        other = McpServer(good.url, owner="bob")
        await client.call_tool(other, "echo", {"text": "z"})
    sessions, ended = good.session_stats()
    assert sessions - before <= ended - ended_before  # every one ended by the close
    assert second in ended


async def test_calls_in_flight_are_bounded_per_owner_and_credentials_not_per_header(
    good,
) -> None:
    """One call at a time per server: a header of the request's choosing (the browser's
    ``x-session-id``, or junk) is the same pool; another owner is another. Watched through
    the client's count of calls in flight (not timed: the machine is shared)."""
    async with client_of(good, mcp_max_concurrent_calls=1) as client:

        async def most_in_flight(servers: list[McpServer]) -> int:
            calls = [
                asyncio.ensure_future(client.call_tool(server, "slow", {"seconds": 0.5}))
                for server in servers
            ]
            pools = list({server.key: server for server in servers}.values())
            most = 0
            while not all(call.done() for call in calls):
                most = max(most, sum(client.calls_in_flight(pool) for pool in pools))
                await asyncio.sleep(0.01)
            assert [call.result().output for call in calls] == ["slept 0.5s"] * len(servers)
            return most

        junk = [McpServer(good.url, {"X-Junk": str(i)}, owner="alice") for i in range(2)]
        browser = [
            McpServer(good.url, {"x-session-id": f"resp_{i}"}, owner="alice") for i in range(2)
        ]
        owners = [McpServer(good.url, owner=owner) for owner in ("alice", "bob")]
        assert await most_in_flight(junk) == 1  # one pool: one call at a time
        assert await most_in_flight(browser) == 1
        assert await most_in_flight(owners) == 2  # two pools, a call in each at once


SCRIPT = {
    "turns": [
        {"match": r"MCP-ECHOED-2", "items": [{"text": "Done."}]},
        {
            "match": r"MCP-ECHOED-1",
            "items": [
                {
                    "function_call": {
                        "namespace": "docs",
                        "name": "echo",
                        "arguments": {"text": "MCP-ECHOED-2"},
                    }
                }
            ],
        },
        {
            "match": "TWO-CALLS",
            "items": [
                {
                    "function_call": {
                        "namespace": "docs",
                        "name": "echo",
                        "arguments": {"text": "MCP-ECHOED-1"},
                    }
                }
            ],
        },
    ]
}


async def test_a_responses_listing_and_calls_share_one_session_and_so_do_an_owners_responses(
    tmp_path, good
) -> None:
    args = AppArgs.model_validate({"tools": {"mcp_allow": [good.origin]}})
    engine = SimulatedEngineConfig(script=SCRIPT, decode_tokens_per_s=50_000)
    keys = ApiKeys([API_KEY, OTHER_API_KEY])
    tool = {
        "type": "mcp",
        "server_label": "docs",
        "server_url": good.url,
        "require_approval": "never",
    }
    before, _ = good.session_stats()
    async with in_process_api(tmp_path / "s.db", args, engine=engine, api_keys=keys) as api:
        mine, theirs = sdk_client(api, API_KEY), sdk_client(api, OTHER_API_KEY)
        first = await mine.responses.create(model=MODEL, input="TWO-CALLS", tools=[tool])
        assert [item.type for item in first.output] == [
            "mcp_list_tools",
            "mcp_call",
            "mcp_call",
            "message",
        ]
        assert len(new_sessions(good, before)) == 1  # a listing and two calls: one session
        await mine.responses.create(model=MODEL, input="TWO-CALLS", tools=[tool])
        assert len(new_sessions(good, before)) == 1  # the owner's next response: the same
        await theirs.responses.create(model=MODEL, input="TWO-CALLS", tools=[tool])
        assert len(new_sessions(good, before)) == 2  # another key's: its own


async def test_a_sessions_calls_keep_their_connection(good, monkeypatch) -> None:
    """The SDK stops reading a call's event stream at its answer; the rest is read, so the
    connection serves the next call (it was one TCP connection per call)."""
    import httpcore2

    made: list[object] = []
    connection = httpcore2.AsyncHTTPConnection.__init__

    def counted(self: object, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        connection(self, *args, **kwargs)

    monkeypatch.setattr(httpcore2.AsyncHTTPConnection, "__init__", counted)
    async with client_of(good) as client:
        server = McpServer(good.url, owner="alice")
        await client.call_tool(server, "echo", {"text": "first"})
        before = len(made)
        for index in range(10):
            assert (await client.call_tool(server, "echo", {"text": str(index)})).output == str(
                index
            )
    assert len(made) - before <= 1


async def test_a_listing_like_the_sessions_last_is_rendered_once(
    tmp_path, good, monkeypatch
) -> None:
    """The prompt is rendered before the listing with the session's last one (a guess): when
    the listing says the same, it stands (one render); when not, it is rendered again."""
    from serve_app.serving.turn.rendering import Renderer

    renders: list[int] = []
    render = Renderer.render

    async def counted(self: Renderer, context: Any, owner: Any, *, truncate: bool) -> Any:
        prompt = await render(self, context, owner, truncate=truncate)
        renders.append(len(prompt.tools.tools))
        return prompt

    monkeypatch.setattr(Renderer, "render", counted)
    args = AppArgs.model_validate({"tools": {"mcp_allow": [good.origin]}})
    engine = SimulatedEngineConfig(script=SCRIPT, decode_tokens_per_s=50_000)
    tool = {
        "type": "mcp",
        "server_label": "docs",
        "server_url": good.url,
        "require_approval": "never",
    }
    async with in_process_api(tmp_path / "s.db", args, engine=engine) as api:
        client = sdk_client(api)
        first = await client.responses.create(model=MODEL, input="TWO-CALLS", tools=[tool])
        assert renders == [0, 7]  # no tools known, then the listing's seven
        renders.clear()
        second = await client.responses.create(model=MODEL, input="TWO-CALLS", tools=[tool])
        assert renders == [7]  # guessed right: rendered once
        renders.clear()
        narrower = {**tool, "allowed_tools": ["echo"]}
        third = await client.responses.create(model=MODEL, input="TWO-CALLS", tools=[narrower])
        assert renders == [1]  # the filter applies to the guess too
        renders.clear()
        stale = ListOutcome(tools=[McpListToolsTool(name="gone", input_schema={"type": "object"})])
        monkeypatch.setattr(McpClient, "listed_before", lambda self, server: stale)
        fourth = await client.responses.create(model=MODEL, input="TWO-CALLS", tools=[tool])
        assert renders == [1, 7]  # guessed wrong: rendered again with what the server listed
    for response in (first, second, third, fourth):
        assert response.output[0].type == "mcp_list_tools"
        assert [item.type for item in response.output][1:] == ["mcp_call", "mcp_call", "message"]
