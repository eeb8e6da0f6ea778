"""MCP items as OpenAI streams them (issue 46): an ``mcp_call``'s ``response.mcp_call.in_progress``
comes right after its ``output_item.added``, before its argument deltas (the model's calls and
approved ones alike); with ``allowed_tools``, ``mcp_list_tools`` lists the allowed tools only;
``allowed_tools: {"read_only": true}`` shows the read-only tools and lets the model call them.

The whole app in this process; the MCP client's listing and call are replaced (`Gate` of
test_mcp_once.py, opened from the start).
"""

from __future__ import annotations

from typing import Any

from openai.types.responses.response_output_item import McpListToolsTool

from serve_app.serving.tools.mcp.client import ListOutcome, McpClient, McpServer
from tests.support import MODEL
from tests.support.helpers import sdk_client
from tests.unit.serving.tools.test_mcp_once import (  # noqa: F401 - the gate fixture
    Gate,
    app,
    approve,
    docs,
    gate,
    the,
)

READ = McpListToolsTool(
    name="echo",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
    annotations={"readOnlyHint": True},
)
WRITE = McpListToolsTool(name="wipe", input_schema={"type": "object"})
ORIGIN = "http://127.0.0.1:9"


def listing_of(monkeypatch, *tools: McpListToolsTool) -> None:
    async def list_tools(client: McpClient, server: McpServer) -> ListOutcome:
        return ListOutcome(tools=list(tools))

    monkeypatch.setattr(McpClient, "list_tools", list_tools)


def call_events(events: list[Any], item_type: str = "mcp_call") -> list[str]:
    """The types of the events of the first ``item_type`` item, in order."""
    added = next(
        e for e in events if e.type == "response.output_item.added" and e.item.type == item_type
    )
    item_id = added.item.id
    return [
        e.type
        for e in events
        if getattr(e, "item_id", None) == item_id
        or getattr(getattr(e, "item", None), "id", None) == item_id
    ]


OPENAI_ORDER = [
    "response.output_item.added",
    "response.mcp_call.in_progress",
    "response.mcp_call_arguments.delta",
    "response.mcp_call_arguments.done",
    "response.mcp_call.completed",
    "response.output_item.done",
]


async def test_mcp_call_in_progress_follows_added_before_the_arguments(
    tmp_path,
    gate: Gate,  # noqa: F811
) -> None:
    gate.opened.set()
    async with app(tmp_path / "s.db", ORIGIN) as api:
        client = sdk_client(api)
        stream = await client.responses.create(
            model=MODEL, input="DOCS-ECHO-TASK", tools=[docs()], stream=True
        )
        events = [event async for event in stream]
        tool = docs(require_approval="always")
        asked = await client.responses.create(model=MODEL, input="DOCS-ECHO-TASK", tools=[tool])
        stream = await client.responses.create(
            model=MODEL,
            previous_response_id=asked.id,
            input=[approve(the(asked, "mcp_approval_request").id)],
            tools=[tool],
            stream=True,
        )
        approved = [event async for event in stream]
    assert call_events(events) == OPENAI_ORDER  # the model's call
    assert call_events(approved) == OPENAI_ORDER  # an approved one


async def test_allowed_tools_leave_the_others_out_of_the_listing(tmp_path, monkeypatch) -> None:
    listing_of(monkeypatch, READ, WRITE)
    async with app(tmp_path / "s.db", ORIGIN) as api:
        client = sdk_client(api)
        by_name = await client.responses.create(
            model=MODEL, input="hi", tools=[docs(allowed_tools=["wipe"])]
        )
        by_hint = await client.responses.create(
            model=MODEL, input="hi", tools=[docs(allowed_tools={"read_only": True})]
        )
    assert [tool.name for tool in the(by_name, "mcp_list_tools").tools] == ["wipe"]
    assert [tool.name for tool in the(by_hint, "mcp_list_tools").tools] == ["echo"]


async def test_read_only_allowed_tools_can_be_called(
    tmp_path,
    gate: Gate,  # noqa: F811
    monkeypatch,
) -> None:
    gate.opened.set()
    listing_of(monkeypatch, READ, WRITE)
    async with app(tmp_path / "s.db", ORIGIN) as api:
        client = sdk_client(api)
        answer = await client.responses.create(
            model=MODEL, input="DOCS-ECHO-TASK", tools=[docs(allowed_tools={"read_only": True})]
        )
    call = the(answer, "mcp_call")
    assert (call.status, call.output, call.error) == ("completed", "echo ran", None)
    assert gate.called == 1
