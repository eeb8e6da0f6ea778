"""A Codex-style tool loop, run by the server (issue 39, Show): one response makes several MCP
calls in a row (two in parallel in one step, then one more) before it answers, streamed over
SSE and over a WebSocket; it is stored, a follow-up continues it by ``previous_response_id``
(the server's tools not listed again), and every round of the conversation lands on the same
engine replica, whose cached prefix of it grows.

The scripted turns are ``LOOP-*`` in tests/fixtures/engine_script.yaml; the MCP server is the
``good`` test server (tests/support/mcp_servers.py) on loopback, under the label ``loop``, on
the port tests/support/mcp_app.py gives the role ``loop`` (the app's allowlist names it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from serve_app.routing.kv_summary import HELD_KEY
from tests.support import MODEL
from tests.support.mcp_app import port
from tests.support.mcp_servers import McpTestServer, mcp_server
from tests.support.replicas import engine_replica_serving, reported_for, routing_stats
from tests.support.websocket import connected, until_terminal

LABEL = "loop"
SLOW_S = 2.5  # each of the two parallel calls (the script's `slow` arguments)
# The first response's output: the tools listed, then each round's reasoning and calls.
FIRST_OUTPUT = [
    "mcp_list_tools",
    "reasoning",
    "mcp_call",
    "mcp_call",
    "reasoning",
    "mcp_call",
    "reasoning",
    "message",
]
# The follow-up's: the listing is in its context already, so not made again.
FOLLOWUP_OUTPUT = ["reasoning", "mcp_call", "reasoning", "message"]


@pytest.fixture(scope="module")
def loop_server() -> Iterator[McpTestServer]:
    with mcp_server("good", port=port("loop")) as server:  # a port the app allows
        yield server


def mcp_tool(server: McpTestServer) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": LABEL,
        "server_url": server.url,
        "allowed_tools": ["slow", "echo"],
        "require_approval": "never",
    }


def timed_sse(client: OpenAI, **create: Any) -> list[tuple[float, Any]]:
    """A streamed response's events, each with when it arrived."""
    stream = client.responses.create(model=MODEL, stream=True, **create)
    return [(time.monotonic(), event) for event in stream]


def timed_ws(connection: Any, **create: Any) -> list[tuple[float, Any]]:
    connection.response.create(model=MODEL, **create)
    events = until_terminal(connection)
    # The socket's events arrive as they are read; the loop's timing is checked over SSE.
    return [(time.monotonic(), event) for event in events]


def check_stream(events: list[tuple[float, Any]], output: list[str]) -> Any:
    """The stream is one well-formed response with ``output`` (item types, in order); each
    server-run call's events come in order; returns the final Response."""
    kinds = [event.type for _, event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert [event.sequence_number for _, event in events] == list(range(len(events)))
    added = [event for _, event in events if event.type == "response.output_item.added"]
    assert [event.output_index for event in added] == list(range(len(output)))
    assert [event.item.type for event in added] == output
    for call in (event.item for event in added if event.item.type == "mcp_call"):
        mine = [
            event.type
            for _, event in events
            if getattr(event, "item_id", None) == call.id
            or getattr(getattr(event, "item", None), "id", None) == call.id
        ]
        steps = [kind for kind in mine if not kind.endswith(".delta")]
        assert steps == [
            "response.output_item.added",
            "response.mcp_call.in_progress",
            "response.mcp_call_arguments.done",
            "response.mcp_call.completed",
            "response.output_item.done",
        ], mine
    response = events[-1][1].response
    assert [item.type for item in response.output] == output
    done = [event.item for _, event in events if event.type == "response.output_item.done"]
    assert [item.model_dump() for item in done] == [item.model_dump() for item in response.output]
    return response


def check_first(response: Any) -> None:
    listing = response.output[0]
    assert listing.server_label == LABEL and listing.error is None
    assert {"slow", "echo"} <= {tool.name for tool in listing.tools}
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [(call.server_label, call.name) for call in calls] == [
        (LABEL, "slow"),
        (LABEL, "slow"),
        (LABEL, "echo"),
    ]
    assert [call.error for call in calls] == [None, None, None]
    assert [call.output for call in calls] == [
        f"slept {SLOW_S}s",
        f"slept {SLOW_S}s",
        "LOOP-TESTS-PASSED",
    ]
    assert response.output_text == "Done: the tests pass (LOOP-DONE)."
    assert from_cache(response)


def check_followup(response: Any, first: Any) -> None:
    call = response.output[1]
    assert (call.name, call.output, call.error) == ("echo", "LOOP-FOLLOWUP-ECHO", None)
    assert response.output_text == "Still green: LOOP-FOLLOWUP-DONE."
    assert response.previous_response_id == first.id
    # The whole first response is the follow-up's prompt, most of it from the cache.
    assert from_cache(response)


def from_cache(response: Any) -> bool:
    """Most of the prompt tokens of the response's rounds (usage sums them) were cached: each
    continuation found the prefix before it (the last prompt, the model's calls, the tools'
    messages) on its engine replica."""
    usage = response.usage
    return usage.input_tokens_details.cached_tokens >= usage.input_tokens // 2


def test_one_response_runs_three_mcp_calls_two_at_once_then_answers_over_sse(
    client: OpenAI, loop_server: McpTestServer
) -> None:
    key = f"tool-loop-{uuid.uuid4()}"
    tools = [mcp_tool(loop_server)]
    events = timed_sse(
        client, input="LOOP-TASK: wait twice, then run the tests", tools=tools, prompt_cache_key=key
    )
    first = check_stream(events, FIRST_OUTPUT)
    check_first(first)
    # The two `slow` calls ran at once: from the first call's <|call|> to the second round's
    # first event, one call's time and the loop's, not two calls' (5 s or more).
    called = next(t for t, e in events if e.type == "response.mcp_call_arguments.done")
    second_round = FIRST_OUTPUT.index("mcp_call") + 2  # its reasoning's output index
    resumed = next(
        t
        for t, e in events
        if e.type == "response.output_item.added" and e.output_index == second_round
    )
    assert SLOW_S - 0.5 <= resumed - called < 2 * SLOW_S - 0.5, resumed - called

    # Stored as streamed.
    stored = client.responses.retrieve(first.id)
    assert stored.status == "completed"
    assert [item.model_dump() for item in stored.output] == [
        item.model_dump() for item in first.output
    ]

    # The follow-up continues it by previous_response_id: the loop runs again, no new listing.
    events = timed_sse(
        client,
        input="LOOP-FOLLOWUP-TASK: check again",
        tools=tools,
        prompt_cache_key=key,
        previous_response_id=first.id,
    )
    check_followup(check_stream(events, FOLLOWUP_OUTPUT), first)


def test_the_same_loop_over_a_websocket_with_store_false(
    client: OpenAI, loop_server: McpTestServer
) -> None:
    key = f"tool-loop-ws-{uuid.uuid4()}"
    tools = [mcp_tool(loop_server)]
    with connected(client, deadline_s=90) as connection:
        events = timed_ws(
            connection,
            input="LOOP-TASK: wait twice, then run the tests",
            tools=tools,
            prompt_cache_key=key,
            store=False,
        )
        first = check_stream(events, FIRST_OUTPUT)
        check_first(first)
        # On the same socket, only the new message: the socket holds the unstored response.
        events = timed_ws(
            connection,
            input="LOOP-FOLLOWUP-TASK: check again",
            tools=tools,
            prompt_cache_key=key,
            previous_response_id=first.id,
            store=False,
        )
        check_followup(check_stream(events, FOLLOWUP_OUTPUT), first)


def held_by(actor: dict, key: str) -> int:
    """Prompt tokens of the conversation ``key`` the engine replica holds in its prefix cache
    (from its KV-cache events, as it reports them to the routers)."""
    return reported_for(routing_stats(actor)[HELD_KEY], key, default=0)


def test_every_round_lands_on_one_engine_replica_whose_cache_of_it_grows(
    client: OpenAI, loop_server: McpTestServer, app_cluster: None
) -> None:
    """Two engine replicas: each round of both responses (the model's continuation after each
    tool step) goes to the replica that holds the conversation, by its prompt_cache_key."""
    key = f"tool-loop-home-{uuid.uuid4()}"
    tools = [mcp_tool(loop_server)]
    events = timed_sse(client, input="LOOP-TASK: on one replica", tools=tools, prompt_cache_key=key)
    first = check_stream(events, FIRST_OUTPUT)
    # Only one replica reports serving it (engine_replica_serving asserts that): none of the
    # three rounds went elsewhere.
    home = engine_replica_serving(key)
    assert home is not None
    held = [held_by(home, key)]
    assert held[0] > 0
    rounds = []
    for turn in range(2):
        events = timed_sse(
            client,
            input=f"LOOP-FOLLOWUP-TASK: check again ({turn})",
            tools=tools,
            prompt_cache_key=key,
            previous_response_id=(rounds[-1] if rounds else first).id,
        )
        rounds.append(check_stream(events, FOLLOWUP_OUTPUT))
        assert engine_replica_serving(key) == home
        held.append(held_by(home, key))
    # The replica's cache of the conversation grows with it, and so does what each follow-up
    # (two rounds each) finds cached.
    assert held == sorted(set(held)), held
    cached = [r.usage.input_tokens_details.cached_tokens for r in rounds]
    assert cached == sorted(set(cached)), cached
    assert all(from_cache(response) for response in (first, *rounds))
