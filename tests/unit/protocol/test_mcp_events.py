"""MCP items and events through the event writer, as a client reads them: every event
validates as the openai SDK's `ResponseStreamEvent`, in OpenAI's order, and the final Response
as its `Response`."""

from __future__ import annotations

from openai.types.responses import Response

from serve_app.protocol import mcp_events
from serve_app.protocol.responses import dump_response, usage
from serve_app.protocol.tool_items import ToolResult
from tests.unit.protocol.test_stream_events import new_writer, wire


def types(events: list[dict]) -> list[str]:
    return [event["type"] for event in events]


def test_an_mcp_call_streams_its_arguments_runs_and_completes() -> None:
    writer = new_writer()
    writer.start()
    call = writer.open_tool_call(mcp_events.MCP_KIND, "echo", "docs")
    writer.text(call, '{"text": ')
    writer.text(call, '"hi"}')
    writer.close(call, "completed")
    (pending,) = writer.take_pending_calls()
    writer.tool_running(pending)
    writer.close_tool_call(pending, ToolResult(output="hi"))
    writer.finish("completed", usage(5, 0, 3, 0))
    events = wire(writer)
    assert types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = events[2]["item"], events[-2]["item"]
    assert added["type"] == "mcp_call" and added["status"] == "in_progress"
    assert added["id"].startswith("mcp_") and added["server_label"] == "docs"
    assert events[6]["arguments"] == '{"text": "hi"}'
    assert done["status"] == "completed" and done["output"] == "hi" and done["error"] is None
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    final = Response.model_validate(dump_response(writer.response))
    assert final.output[0].type == "mcp_call"


def test_a_failed_call_is_a_failed_item_with_the_sdks_error() -> None:
    writer = new_writer()
    writer.start()
    call = writer.open_tool_call(mcp_events.MCP_KIND, "hang", "bad")
    writer.close(call, "completed")
    (pending,) = writer.take_pending_calls()
    writer.tool_running(pending)
    writer.close_tool_call(pending, ToolResult(error="The call timed out after 1 s."))
    events = wire(writer)
    assert types(events)[-2:] == ["response.mcp_call.failed", "response.output_item.done"]
    done = events[-1]["item"]
    assert done["status"] == "failed" and done["output"] is None
    assert done["arguments"] == "{}"
    assert done["error"] == {
        "type": "mcp_tool_execution_error",
        "content": [{"type": "text", "text": "The call timed out after 1 s."}],
    }


def test_a_call_needing_approval_is_an_approval_request_without_events_of_its_own() -> None:
    writer = new_writer()
    writer.start()
    call = writer.open_tool_call(mcp_events.MCP_APPROVAL_KIND, "wipe", "docs")
    writer.text(call, '{"all": true}')
    writer.close(call, "completed")
    (pending,) = writer.take_pending_calls()
    writer.tool_running(pending)
    writer.close_tool_call(pending, ToolResult(awaits_client=True))
    events = wire(writer)
    assert types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
    ]
    done = events[-1]["item"]
    assert done == {
        "id": done["id"],
        "type": "mcp_approval_request",
        "server_label": "docs",
        "name": "wipe",
        "arguments": '{"all": true}',
    }
    assert done["id"].startswith("mcpr_")


def test_a_listing_completes_with_its_tools_or_fails_with_its_error() -> None:
    writer = new_writer()
    writer.start()
    tool = mcp_events.listed_tool("echo", {"type": "object"}, "Say it back.", None)
    for label, result in (
        ("docs", ToolResult(data={"tools": [tool]})),
        ("down", ToolResult(error="The server could not be reached.")),
    ):
        listing = writer.open_tool_call(mcp_events.MCP_LIST_KIND, "", label)
        writer.tool_running(listing)
        writer.close_tool_call(listing, result)
    events = wire(writer)
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.failed",
        "response.output_item.done",
    ]
    assert events[2]["item"]["tools"] == [] and events[2]["item"]["id"].startswith("mcpl_")
    assert events[5]["item"]["tools"][0]["name"] == "echo"
    assert events[9]["item"]["error"] == "The server could not be reached."
