"""MCP output items and their stream events, as the openai SDK types them, built for the tool
loop's writer (serve_app.protocol.tool_items: one `ToolItemBuilder` per kind, its events
numbered by the writer). No harmony, no Ray.

OpenAI's order, which the writer keeps with these builders:

- ``mcp_list_tools`` (kind ``mcp_list``, made before the model runs): ``output_item.added`` (no
  tools yet), ``response.mcp_list_tools.in_progress``, then ``.completed`` or ``.failed``,
  ``output_item.done`` (the tools, or ``error``);
- ``mcp_call`` (kind ``mcp``): ``output_item.added`` (``in_progress``),
  ``response.mcp_call.in_progress`` right after it (OpenAI's order: before the arguments, not
  when the call starts running), ``response.mcp_call_arguments.delta`` as the model writes,
  ``.done`` at its ``<|call|>``, then ``response.mcp_call.completed`` or ``.failed``,
  ``output_item.done`` (``output``, or ``error`` as the SDK's error object);
- ``mcp_approval_request`` (kind ``mcp_approval``): ``output_item.added`` and
  ``output_item.done``, nothing between; the response ends with it.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    ResponseStreamEvent,
)
from openai.types.responses.mcp_tool_call_error import McpToolCallError, McpToolExecutionError
from openai.types.responses.response_output_item import (
    McpApprovalRequest,
    McpCall,
    McpListTools,
    McpListToolsTool,
)

from serve_app.protocol.mcp_items import LISTING_SEAL
from serve_app.protocol.stream_items import OpenItem, call_arguments
from serve_app.protocol.tool_items import (
    ItemStatus,
    QuietEvents,
    ToolResult,
    register_tool_items,
)

# OpenAI's item id prefixes.
LIST_PREFIX, CALL_PREFIX, APPROVAL_PREFIX = "mcpl", "mcp", "mcpr"


# --- items ---------------------------------------------------------------------------------


def list_tools_item(
    item_id: str,
    server_label: str,
    tools: Sequence[McpListToolsTool] = (),
    error: str | None = None,
    seal: str | None = None,
) -> McpListTools:
    """The item; ``seal``: the server's seal of it (serve_app/serving/tools/mcp_trust.py), in
    a field of ours beside OpenAI's (`LISTING_SEAL`)."""
    fields: dict[str, Any] = {"error": error} if error is not None else {}
    if seal is not None:
        fields[LISTING_SEAL] = seal
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
    """A call that failed without a server's error object (it could not be run)."""
    return McpToolExecutionError(
        type="mcp_tool_execution_error", content=[{"type": "text", "text": message}]
    )


def _common(item: OpenItem) -> dict[str, Any]:
    # Events are numbered by the writer (tool_items.py): 0 here.
    return {"item_id": item.item_id, "output_index": item.output_index, "sequence_number": 0}


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
        return [
            ResponseMcpCallArgumentsDeltaEvent(
                type="response.mcp_call_arguments.delta", delta=delta, **_common(item)
            )
        ]

    def arguments_done(self, item: OpenItem) -> list[ResponseStreamEvent]:
        arguments = call_arguments(item.text)
        return [
            ResponseMcpCallArgumentsDoneEvent(
                type="response.mcp_call_arguments.done", arguments=arguments, **_common(item)
            )
        ]

    def opened(self, item: OpenItem) -> list[ResponseStreamEvent]:
        """Right after ``output_item.added``: the call is in progress from its first token."""
        return [
            ResponseMcpCallInProgressEvent(type="response.mcp_call.in_progress", **_common(item))
        ]

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return []  # said at `opened`

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
        if error is not None:
            ended: ResponseStreamEvent = ResponseMcpCallFailedEvent(
                type="response.mcp_call.failed", **_common(item)
            )
        else:
            ended = ResponseMcpCallCompletedEvent(
                type="response.mcp_call.completed", **_common(item)
            )
        return [ended], final


class McpApprovalItems(QuietEvents):
    """``mcp_approval_request`` items, the kind ``mcp_approval``: no events of their own
    (``output_item.added`` and ``.done``); the response ends with it, awaiting the client."""

    id_prefix = APPROVAL_PREFIX

    def added(self, item: OpenItem) -> ResponseOutputItem:
        return approval_request_item(item.item_id, _label(item), item.name, "")

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        arguments = call_arguments(item.text)
        return [], approval_request_item(item.item_id, _label(item), item.name, arguments)


class McpListItems(QuietEvents):
    """``mcp_list_tools`` items, the kind ``mcp_list``: a server listed before the model runs
    (``item.namespace`` the server label; the result's ``data["tools"]`` the tools)."""

    id_prefix = LIST_PREFIX

    def added(self, item: OpenItem) -> ResponseOutputItem:
        return list_tools_item(item.item_id, _label(item))

    def running(self, item: OpenItem) -> list[ResponseStreamEvent]:
        return [
            ResponseMcpListToolsInProgressEvent(
                type="response.mcp_list_tools.in_progress", **_common(item)
            )
        ]

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        error = "The server was not listed." if result is None else result.error
        tools = [] if result is None or error else list(result.data.get("tools", ()))
        seal = None if result is None or error else result.data.get("seal")
        final = list_tools_item(item.item_id, _label(item), tools, error, seal)
        if error:
            event: ResponseStreamEvent = ResponseMcpListToolsFailedEvent(
                type="response.mcp_list_tools.failed", **_common(item)
            )
        else:
            event = ResponseMcpListToolsCompletedEvent(
                type="response.mcp_list_tools.completed", **_common(item)
            )
        return [event], final


register_tool_items(MCP_KIND, McpCallItems())
register_tool_items(MCP_APPROVAL_KIND, McpApprovalItems())
register_tool_items(MCP_LIST_KIND, McpListItems())
