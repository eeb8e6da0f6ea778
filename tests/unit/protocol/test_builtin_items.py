"""web_search_call and code_interpreter_call items and events through the response's writer, as
the tool loop drives them (open, arguments, pending, running, done): each event and item
validates as the openai SDK's type, in OpenAI's order, with the item's status."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import ResponseOutputItem, ResponseStreamEvent
from pydantic import TypeAdapter

from serve_app.protocol import builtin_items
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import initial_response
from serve_app.protocol.stream_events import ResponseEventWriter
from serve_app.protocol.tool_items import ToolResult
from tests.support import MODEL

EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
ITEM: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)


def run_call(
    kind: str, name: str, namespace: str | None, arguments: list[str], result: ToolResult | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One call's events (as JSON the client reads, validated as the SDK's) and its item."""
    request = ResponsesRequest.model_validate({"model": MODEL, "input": "hi"})
    writer = ResponseEventWriter(initial_response(request, response_id="resp_1", model=MODEL))
    item = writer.open_tool_call(kind, name, namespace)
    for delta in arguments:
        writer.text(item, delta)
    writer.close(item, "completed")
    (pending,) = writer.take_pending_calls()
    writer.tool_running(pending)
    writer.close_tool_call(pending, result, "completed" if result else "incomplete")
    events = writer.take_events()
    assert [event.sequence_number for event in events] == list(range(len(events)))
    wire = [EVENT.validate_json(event.model_dump_json()).model_dump(exclude_none=True)
            for event in events]  # fmt: skip
    (final,) = writer.output_items
    return wire, ITEM.validate_json(final.model_dump_json()).model_dump(exclude_none=True)


def test_a_search_call() -> None:
    result = ToolResult(output="[0] zebras ...", data={builtin_items.SOURCES: ["u1", "u2"]})
    wire, item = run_call("browser", "search", "browser", ['{"query":', ' "zebras"}'], result)
    assert [event["type"] for event in wire] == [
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
        "response.output_item.done",
    ]
    assert wire[0]["item"]["action"] == {"type": "search"}
    assert item["id"].startswith("ws_") and item["status"] == "completed"
    assert item["action"] == {
        "type": "search",
        "query": "zebras",
        "sources": [{"type": "url", "url": "u1"}, {"type": "url", "url": "u2"}],
    }


@pytest.mark.parametrize(
    ("name", "arguments", "data", "action"),
    [
        ("open", '{"id": 3, "cursor": 0}', {"url": "http://d/z.md"},
         {"type": "open_page", "url": "http://d/z.md"}),
        ("open", '{"id": "http://d/h.md"}', {}, {"type": "open_page", "url": "http://d/h.md"}),
        ("find", '{"pattern": "stripes"}', {"url": "http://d/z.md"},
         {"type": "find_in_page", "pattern": "stripes", "url": "http://d/z.md"}),
        ("search", "not json", {}, {"type": "search"}),
    ],
)  # fmt: skip
def test_the_action_of_each_browser_call(
    name: str, arguments: str, data: dict, action: dict
) -> None:
    _, item = run_call("browser", name, "browser", [arguments], ToolResult(output="x", data=data))
    assert item["action"] == action


def test_a_failed_call_is_failed_without_a_completed_event() -> None:
    wire, item = run_call("browser", "open", "browser", ['{"id": 9}'], ToolResult(error="no"))
    assert item["status"] == "failed"
    assert "response.web_search_call.completed" not in [event["type"] for event in wire]


def test_a_call_that_never_ran_is_incomplete() -> None:
    wire, item = run_call("python", "python", None, ["print(1)"], None)
    assert item["status"] == "incomplete" and item["code"] == "print(1)"
    assert "response.code_interpreter_call.completed" not in [event["type"] for event in wire]


def test_a_python_call() -> None:
    result = ToolResult(output="42\n", data={builtin_items.LOGS: "42\n"})
    wire, item = run_call("python", "python", None, ["print(", "6 * 7)"], result)
    assert [event["type"] for event in wire] == [
        "response.output_item.added",
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
        "response.output_item.done",
    ]
    assert [event["delta"] for event in wire if "delta" in event] == ["print(", "6 * 7)"]
    assert wire[4]["code"] == "print(6 * 7)"
    assert item == {
        "id": item["id"],
        "type": "code_interpreter_call",
        "status": "completed",
        "code": "print(6 * 7)",
        "container_id": "auto",
        "outputs": [{"type": "logs", "logs": "42\n"}],
    }
    assert item["id"].startswith("ci_")


def test_python_without_code_still_says_in_progress_first() -> None:
    wire, item = run_call("python", "python", None, [], ToolResult(output=""))
    types = [event["type"] for event in wire]
    assert types[:3] == [
        "response.output_item.added",
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.done",
    ]
    assert "outputs" not in item  # none given: null, left out of this dump
