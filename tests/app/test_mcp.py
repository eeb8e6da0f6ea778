"""`mcp` tools end to end through the openai SDK against the running app, with MCP servers the
test starts on loopback (the `mcp` SDK's own server classes, tests/support/mcp_servers.py, and
npm's `@modelcontextprotocol/server-everything`): the server lists, the model calls
``to=<server_label>.<tool>`` (tests/fixtures/engine_script.yaml), the server runs the call and
the model answers, in one response, streamed (SSE, WebSocket) or not; approvals round trip;
bad servers end in a failed item or a clean answer, never a hang.

The app's allowlist names the servers' ports (tests/support/mcp_app.py says how, for an app
started apart).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from openai import BadRequestError, OpenAI

from tests.support import MODEL
from tests.support.mcp_app import everything_server, port
from tests.support.mcp_servers import mcp_server
from tests.support.websocket import connected, until_terminal

TOKEN = "mcp-secret-7f3a9c"


def mcp_tool(url: str, label: str = "docs", **fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": label,
        "server_url": url,
        "require_approval": "never",
        **fields,
    }


@pytest.fixture(scope="module")
def good():
    with mcp_server("good", port=port("good"), token=TOKEN) as server:
        yield server


def secured(url: str, **fields: Any) -> dict[str, Any]:
    """The good server's tool with its credentials (the server refuses requests without)."""
    return mcp_tool(url, authorization=TOKEN, **fields)


def kinds(response) -> list[str]:
    return [item.type for item in response.output]


def the(response, item_type: str):
    (item,) = [item for item in response.output if item.type == item_type]
    return item


def test_list_call_and_answer_in_one_response(client: OpenAI, good) -> None:
    response = client.responses.create(
        model=MODEL, input="MCP-ECHO-TASK", tools=[secured(good.url)]
    )
    assert response.status == "completed"
    assert kinds(response) == ["mcp_list_tools", "reasoning", "mcp_call", "reasoning", "message"]
    listing = the(response, "mcp_list_tools")
    assert listing.server_label == "docs" and listing.error is None
    assert {"echo", "add", "slow", "fail", "seen_headers"} <= {tool.name for tool in listing.tools}
    call = the(response, "mcp_call")
    assert (call.name, call.server_label, call.status) == ("echo", "docs", "completed")
    assert call.arguments == '{"text": "MCP-ECHOED-7"}' and call.output == "MCP-ECHOED-7"
    assert response.output_text == "The server said MCP-ECHOED-7."


def test_streamed_over_sse_every_step_as_it_happens(client: OpenAI, good) -> None:
    with client.responses.stream(
        model=MODEL, input="MCP-ECHO-TASK", tools=[secured(good.url)]
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    expected = [
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_text.delta",
        "response.completed",
    ]
    positions = [types.index(name) for name in expected]
    assert positions == sorted(positions)
    assert kinds(final) == ["mcp_list_tools", "reasoning", "mcp_call", "reasoning", "message"]
    assert final.output_text == "The server said MCP-ECHOED-7."


def test_streamed_over_a_websocket(client: OpenAI, good) -> None:
    with connected(client) as connection:
        connection.response.create(model=MODEL, input="MCP-ECHO-TASK", tools=[secured(good.url)])
        events = until_terminal(connection)
    types = [event.type for event in events]
    assert types[-1] == "response.completed"
    assert "response.mcp_list_tools.completed" in types and "response.mcp_call.completed" in types
    assert events[-1].response.output_text == "The server said MCP-ECHOED-7."


def test_an_sse_server_is_listed_and_called_too(client: OpenAI) -> None:
    with mcp_server("good", transport="sse", port=port("good_sse")) as server:
        response = client.responses.create(
            model=MODEL, input="MCP-ECHO-TASK", tools=[mcp_tool(server.url)]
        )
    assert the(response, "mcp_call").output == "MCP-ECHOED-7"


def test_approval_round_trip_by_previous_response_id(client: OpenAI, good) -> None:
    tool = secured(good.url, require_approval="always")
    asked = client.responses.create(model=MODEL, input="MCP-ECHO-TASK", tools=[tool])
    assert asked.status == "completed"
    assert kinds(asked) == ["mcp_list_tools", "reasoning", "mcp_approval_request"]
    request = the(asked, "mcp_approval_request")
    assert (request.name, request.server_label) == ("echo", "docs")
    assert request.arguments == '{"text": "MCP-ECHOED-7"}'

    approved = client.responses.create(
        model=MODEL,
        previous_response_id=asked.id,
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
        ],
        tools=[tool],
    )
    # The listing is in the context: reused, not listed again. The approved call runs first.
    assert kinds(approved) == ["mcp_call", "reasoning", "message"]
    call = the(approved, "mcp_call")
    assert call.approval_request_id == request.id and call.output == "MCP-ECHOED-7"
    assert approved.output_text == "The server said MCP-ECHOED-7."

    denied = client.responses.create(
        model=MODEL,
        previous_response_id=asked.id,
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False}
        ],
        tools=[tool],
    )
    assert kinds(denied) == ["message"]
    assert denied.output_text == "The call was denied, so I did not run it."


def test_approval_round_trip_stateless(client: OpenAI, good) -> None:
    tool = secured(good.url, require_approval={"always": {"tool_names": ["echo"]}})
    first = [{"role": "user", "content": "MCP-ECHO-TASK"}]
    asked = client.responses.create(model=MODEL, input=first, tools=[tool], store=False)
    request = the(asked, "mcp_approval_request")
    resent = [*first, *[item.model_dump(exclude_none=True) for item in asked.output]]
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    approved = client.responses.create(
        model=MODEL, input=[*resent, answer], tools=[tool], store=False
    )
    assert kinds(approved) == ["mcp_call", "reasoning", "message"]
    assert the(approved, "mcp_call").approval_request_id == request.id


def test_a_listing_is_reused_along_a_chain(client: OpenAI, good) -> None:
    tool = secured(good.url)
    first = client.responses.create(model=MODEL, input="SDK-TEXT", tools=[tool])
    assert kinds(first)[0] == "mcp_list_tools"
    second = client.responses.create(
        model=MODEL, input="MCP-ECHO-TASK", tools=[tool], previous_response_id=first.id
    )
    assert "mcp_list_tools" not in kinds(second)
    assert the(second, "mcp_call").output == "MCP-ECHOED-7"


def test_a_listing_is_reused_in_a_conversation(client: OpenAI, good) -> None:
    tool = secured(good.url)
    conversation = client.conversations.create()
    first = client.responses.create(
        model=MODEL, input="SDK-TEXT", tools=[tool], conversation=conversation.id
    )
    second = client.responses.create(
        model=MODEL, input="MCP-ECHO-TASK", tools=[tool], conversation=conversation.id
    )
    assert kinds(first)[0] == "mcp_list_tools" and "mcp_list_tools" not in kinds(second)
    assert the(second, "mcp_call").output == "MCP-ECHOED-7"


def test_two_calls_in_one_completion_run_concurrently_in_the_models_order(
    client: OpenAI, good
) -> None:
    started = time.monotonic()
    response = client.responses.create(model=MODEL, input="MCP-TWO-TASK", tools=[secured(good.url)])
    took = time.monotonic() - started
    calls = [item for item in response.output if item.type == "mcp_call"]
    assert [call.name for call in calls] == ["slow", "echo"]
    assert [call.output for call in calls] == ["slept 0.5s", "MCP-ECHOED-7"]
    assert response.output_text == "The server said MCP-ECHOED-7." and took < 30


def test_credentials_reach_the_server_and_are_never_echoed_nor_stored(client: OpenAI, good) -> None:
    tool = secured(good.url, headers={"X-Team": "serve-app-team"})
    response = client.responses.create(model=MODEL, input="MCP-ECHO-TASK", tools=[tool])
    assert the(response, "mcp_list_tools").error is None  # the server took the token
    stored = client.responses.retrieve(response.id)
    items = client.responses.input_items.list(response.id)
    for shown in (response, stored):
        (echoed,) = shown.tools
        assert echoed.type == "mcp" and echoed.server_url == good.url
        assert (
            TOKEN not in shown.model_dump_json() and "serve-app-team" not in shown.model_dump_json()
        )
    assert TOKEN not in items.model_dump_json()


def test_a_url_the_operator_does_not_allow_is_a_400_before_any_connection(client: OpenAI) -> None:
    with pytest.raises(BadRequestError) as caught:
        client.responses.create(
            model=MODEL,
            input="MCP-ECHO-TASK",
            tools=[{"type": "function", "name": "f"}, mcp_tool("http://127.0.0.1:1/mcp")],
        )
    assert caught.value.body["param"] == "tools[1].server_url"
    with pytest.raises(BadRequestError) as caught:
        client.responses.create(
            model=MODEL,
            input="hi",
            tools=[
                mcp_tool(f"http://127.0.0.1:{port('good')}/mcp"),
                mcp_tool(f"http://127.0.0.1:{port('good')}/mcp/2"),
            ],
        )
    assert caught.value.body["param"] == "tools[1].server_label"


@pytest.mark.parametrize(
    ("kind", "task", "error"),
    [
        ("hang", "MCP-HANG-TASK", "did not answer"),
        ("huge", "MCP-HUGE-TASK", "bytes"),
        ("drop", "MCP-DROP-TASK", ""),
    ],
)
def test_a_bad_server_ends_in_a_failed_call_and_a_clean_answer(
    client: OpenAI, kind, task, error
) -> None:
    with mcp_server(kind, port=port(kind)) as server:
        started = time.monotonic()
        response = client.responses.create(
            model=MODEL, input=task, tools=[mcp_tool(server.url, "bad")]
        )
        took = time.monotonic() - started
    assert response.status == "completed" and took < 30
    call = the(response, "mcp_call")
    assert call.status == "failed" and call.output is None and call.error is not None
    assert error in call.error.model_dump_json()
    assert kinds(response)[-1] == "message"  # the model read the error and answered


def test_a_server_listing_500_tools_is_listed_and_called(client: OpenAI) -> None:
    with mcp_server("many", port=port("many")) as server:
        response = client.responses.create(
            model=MODEL, input="MCP-MANY-TASK", tools=[mcp_tool(server.url, "bad")]
        )
    assert len(the(response, "mcp_list_tools").tools) == 500
    assert the(response, "mcp_call").output == "MCP-ECHOED-7"


def test_an_unreachable_server_is_a_failed_listing_and_the_model_answers(client: OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input="SDK-TEXT", tools=[mcp_tool(f"http://127.0.0.1:{port('closed')}/mcp")]
    )
    listing = the(response, "mcp_list_tools")
    assert listing.error and listing.tools == []
    assert (
        response.status == "completed" and response.output_text == "Hello from the scripted engine."
    )


def test_the_maintained_everything_server_from_npm_is_listed_and_called(client: OpenAI) -> None:
    with everything_server() as url:
        response = client.responses.create(
            model=MODEL, input="MCP-EVERYTHING-TASK", tools=[mcp_tool(url, "everything")]
        )
    listing = the(response, "mcp_list_tools")
    assert "echo" in {tool.name for tool in listing.tools}
    call = the(response, "mcp_call")
    assert call.output == "Echo: MCP-ECHOED-7" and call.status == "completed"
    assert response.output_text == "The server said MCP-ECHOED-7."
