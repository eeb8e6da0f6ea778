"""MCP output items and their stream events, as the openai SDK types them. No harmony, no Ray.

OpenAI's order, which these builders keep (each given the next sequence number by ``seq``):

- ``mcp_list_tools``: ``output_item.added`` (no tools yet), ``response.mcp_list_tools.
  in_progress``, then ``.completed`` or ``.failed``, ``output_item.done`` (the tools, or
  ``error``);
- ``mcp_call``: ``output_item.added`` (``in_progress``), ``response.mcp_call_arguments.delta``
  as the model writes, ``.done``, ``response.mcp_call.in_progress`` while it runs, then
  ``response.mcp_call.completed`` or ``.failed``, ``output_item.done`` (``output``, or
  ``error``);
- ``mcp_approval_request``: ``output_item.added`` and ``output_item.done``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openai.types.responses import (
    ResponseMcpCallArgumentsDeltaEvent,
    ResponseMcpCallArgumentsDoneEvent,
    ResponseMcpCallCompletedEvent,
    ResponseMcpCallFailedEvent,
    ResponseMcpCallInProgressEvent,
    ResponseMcpListToolsCompletedEvent,
    ResponseMcpListToolsFailedEvent,
    ResponseMcpListToolsInProgressEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseStreamEvent,
)
from openai.types.responses.mcp_tool_call_error import (
    HTTPError,
    McpProtocolError,
    McpToolCallError,
    McpToolExecutionError,
)
from openai.types.responses.response_output_item import (
    McpApprovalRequest,
    McpCall,
    McpListTools,
    McpListToolsTool,
)

from serve_app.protocol.responses import new_item_id
from serve_app.protocol.stream_items import OpenItem, call_arguments
from serve_app.protocol.tool_items import ItemStatus, ToolResult, register_tool_items

Seq = Callable[[], int]

# OpenAI's item id prefixes.
LIST_PREFIX, CALL_PREFIX, APPROVAL_PREFIX = "mcpl", "mcp", "mcpr"


def new_list_id() -> str:
    return new_item_id(LIST_PREFIX)


def new_call_id() -> str:
    return new_item_id(CALL_PREFIX)


def new_approval_id() -> str:
    return new_item_id(APPROVAL_PREFIX)


# --- items ---------------------------------------------------------------------------------


def list_tools_item(
    item_id: str,
    server_label: str,
    tools: Sequence[McpListToolsTool] = (),
    error: str | None = None,
) -> McpListTools:
    fields: dict[str, Any] = {"error": error} if error is not None else {}
    return McpListTools(
        id=item_id, type="mcp_list_tools", server_label=server_label, tools=list(tools), **fields
    )


def listed_tool(
    name: str,
    input_schema: dict[str, Any],
    description: str | None = None,
    annotations: dict[str, Any] | None = None,
) -> McpListToolsTool:
    return McpListToolsTool(
        name=name, input_schema=input_schema, description=description, annotations=annotations
    )


def call_item(
    item_id: str,
    server_label: str,
    name: str,
    arguments: str,
    *,
    status: str = "in_progress",
    output: str | None = None,
    error: McpToolCallError | None = None,
    approval_request_id: str | None = None,
) -> McpCall:
    return McpCall(
        id=item_id,
        type="mcp_call",
        server_label=server_label,
        name=name,
        arguments=arguments,
        status=status,  # type: ignore[arg-type]
        output=output,
        error=error,
        approval_request_id=approval_request_id,
    )


def approval_request_item(
    item_id: str, server_label: str, name: str, arguments: str
) -> McpApprovalRequest:
    return McpApprovalRequest(
        id=item_id,
        type="mcp_approval_request",
        server_label=server_label,
        name=name,
        arguments=arguments,
    )


def execution_error(message: str) -> McpToolCallError:
    """The tool ran and reported an error (``isError``), or could not be run."""
    return McpToolExecutionError(
        type="mcp_tool_execution_error", content=[{"type": "text", "text": message}]
    )


def protocol_error(code: int, message: str) -> McpToolCallError:
    """The server answered with a JSON-RPC error."""
    return McpProtocolError(type="mcp_protocol_error", code=code, message=message)


def http_error(code: int, message: str) -> McpToolCallError:
    return HTTPError(type="http_error", code=code, message=message)


# --- events --------------------------------------------------------------------------------


def added(item: Any, output_index: int, seq: Seq) -> ResponseStreamEvent:
    return ResponseOutputItemAddedEvent(
        type="response.output_item.added",
        output_index=output_index,
        item=item,
        sequence_number=seq(),
    )


def done(item: Any, output_index: int, seq: Seq) -> ResponseStreamEvent:
    return ResponseOutputItemDoneEvent(
        type="response.output_item.done",
        output_index=output_index,
        item=item,
        sequence_number=seq(),
    )


def list_tools_events(item: McpListTools, output_index: int, seq: Seq) -> list[ResponseStreamEvent]:
    """A listing, from ``added`` to ``done`` (it is made whole before its events are sent)."""
    common: dict[str, Any] = {"item_id": item.id, "output_index": output_index}
    ended = ResponseMcpListToolsFailedEvent if item.error else ResponseMcpListToolsCompletedEvent
    kind = "failed" if item.error else "completed"
    return [
        added(list_tools_item(item.id, item.server_label), output_index, seq),
        ResponseMcpListToolsInProgressEvent(
            type="response.mcp_list_tools.in_progress", sequence_number=seq(), **common
        ),
        ended(type=f"response.mcp_list_tools.{kind}", sequence_number=seq(), **common),  # type: ignore[arg-type]
        done(item, output_index, seq),
    ]


def call_arguments_delta(
    item_id: str, output_index: int, delta: str, seq: Seq
) -> ResponseStreamEvent:
    return ResponseMcpCallArgumentsDeltaEvent(
        type="response.mcp_call_arguments.delta",
        item_id=item_id,
        output_index=output_index,
        delta=delta,
        sequence_number=seq(),
    )


def call_arguments_done(
    item_id: str, output_index: int, arguments: str, seq: Seq
) -> ResponseStreamEvent:
    return ResponseMcpCallArgumentsDoneEvent(
        type="response.mcp_call_arguments.done",
        item_id=item_id,
        output_index=output_index,
        arguments=arguments,
        sequence_number=seq(),
    )


def call_running(item_id: str, output_index: int, seq: Seq) -> ResponseStreamEvent:
    return ResponseMcpCallInProgressEvent(
        type="response.mcp_call.in_progress",
        item_id=item_id,
        output_index=output_index,
        sequence_number=seq(),
    )


def call_ended(item: McpCall, output_index: int, seq: Seq) -> list[ResponseStreamEvent]:
    """``response.mcp_call.completed`` (or ``.failed``) and ``output_item.done``."""
    common: dict[str, Any] = {"item_id": item.id, "output_index": output_index}
    if item.error is not None:
        ended: ResponseStreamEvent = ResponseMcpCallFailedEvent(
            type="response.mcp_call.failed", sequence_number=seq(), **common
        )
    else:
        ended = ResponseMcpCallCompletedEvent(
            type="response.mcp_call.completed", sequence_number=seq(), **common
        )
    return [ended, done(item, output_index, seq)]


def whole_call_events(item: McpCall, output_index: int, seq: Seq) -> list[ResponseStreamEvent]:
    """A call the server runs without the model writing it now (an approved request's, at the
    start of the next response): every event of it at once."""
    opened = item.model_copy(update={"status": "in_progress", "output": None, "error": None})
    return [
        added(opened, output_index, seq),
        call_arguments_delta(item.id, output_index, item.arguments, seq),
        call_arguments_done(item.id, output_index, item.arguments, seq),
        call_running(item.id, output_index, seq),
        *call_ended(item, output_index, seq),
    ]


# --- the kinds' builders (serve_app.protocol.tool_items) -----------------------------------

# A call of an MCP server's tool the server runs now, and one that waits for the client's
# approval (`McpTool.needs_approval`): the listing gives each tool one of these kinds.
MCP_KIND, MCP_APPROVAL_KIND = "mcp", "mcp_approval"
# A server's listing, an item the server makes before the model runs.
MCP_LIST_KIND = "mcp_list"


def _label(item: OpenItem) -> str:
    return item.namespace or ""


class McpCallItems:
    """``mcp_call`` items, the kind ``mcp``: arguments streamed as the model writes them."""

    id_prefix = CALL_PREFIX

    def added(self, item: OpenItem) -> ResponseOutputItem:
        return call_item(item.item_id, _label(item), item.name, "")

    def argument_delta(self, item: OpenItem, delta: str) -> list[ResponseStreamEvent]:
        return [call_arguments_delta(item.item_id, item.output_index, delta, _unnumbered)]

    def arguments_done(self, item: OpenItem) -> list[ResponseStreamEvent]:
        arguments = call_arguments(item.text)
        return [call_arguments_done(item.item_id, item.output_index, arguments, _unnumbered)]

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return [call_running(item.item_id, item.output_index, _unnumbered)]

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        arguments = call_arguments(item.text)
        if result is None:
            final = call_item(
                item.item_id,
                _label(item),
                item.name,
                arguments,
                status="incomplete",
                error=execution_error("The call did not run: the response ended first."),
            )
            return [], final
        error = None
        if result.error is not None:
            error = result.data.get("mcp_error") or execution_error(result.error)
        final = call_item(
            item.item_id,
            _label(item),
            item.name,
            arguments,
            status="failed" if error is not None else "completed",
            output=None if error is not None else result.output,
            error=error,
            approval_request_id=result.data.get("approval_request_id"),
        )
        ended = call_ended(final, item.output_index, _unnumbered)
        return ended[:-1], final


class McpApprovalItems:
    """``mcp_approval_request`` items, the kind ``mcp_approval``: no events of their own
    (``output_item.added`` and ``.done``); the response ends with it, awaiting the client."""

    id_prefix = APPROVAL_PREFIX

    def added(self, item: OpenItem) -> ResponseOutputItem:
        return approval_request_item(item.item_id, _label(item), item.name, "")

    def argument_delta(self, item: OpenItem, delta: str) -> list[ResponseStreamEvent]:
        return []

    def arguments_done(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return []

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return []

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        arguments = call_arguments(item.text)
        return [], approval_request_item(item.item_id, _label(item), item.name, arguments)


class McpListItems:
    """``mcp_list_tools`` items, the kind ``mcp_list``: a server listed before the model runs
    (``item.namespace`` the server label; the result's ``data["tools"]`` the tools)."""

    id_prefix = LIST_PREFIX

    def added(self, item: OpenItem) -> ResponseOutputItem:
        return list_tools_item(item.item_id, _label(item))

    def argument_delta(self, item: OpenItem, delta: str) -> list[ResponseStreamEvent]:
        return []

    def arguments_done(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return []

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return [
            ResponseMcpListToolsInProgressEvent(
                type="response.mcp_list_tools.in_progress",
                item_id=item.item_id,
                output_index=item.output_index,
                sequence_number=0,
            )
        ]

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        error = "The server was not listed." if result is None else result.error
        tools = [] if result is None or error else list(result.data.get("tools", ()))
        final = list_tools_item(item.item_id, _label(item), tools, error)
        common: dict[str, Any] = {
            "item_id": item.item_id,
            "output_index": item.output_index,
            "sequence_number": 0,
        }
        if error:
            event: ResponseStreamEvent = ResponseMcpListToolsFailedEvent(
                type="response.mcp_list_tools.failed", **common
            )
        else:
            event = ResponseMcpListToolsCompletedEvent(
                type="response.mcp_list_tools.completed", **common
            )
        return [event], final


def _unnumbered() -> int:
    return 0  # the writer numbers the kinds' events


register_tool_items(MCP_KIND, McpCallItems())
register_tool_items(MCP_APPROVAL_KIND, McpApprovalItems())
register_tool_items(MCP_LIST_KIND, McpListItems())
