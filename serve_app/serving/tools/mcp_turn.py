"""MCP tools in a turn: the door's rules on ``mcp`` tools, each server's listing before the
model runs (or the one its context already holds), approved calls run at the start of the next
response, and the `ToolRunner` of the ``mcp`` and ``mcp_approval`` kinds.

The MCP client (serve_app.serving.tools.mcp) reaches the servers: this module only decides
what to ask it and what its answers become (items the model and the client read). Nothing here
raises past the door: a server that cannot be listed is a failed ``mcp_list_tools`` item (the
model goes on without its tools), a call that fails an ``mcp_call`` with ``error``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from serve_app.config import ToolArgs
from serve_app.harmony.mcp_tools import listed_specs, reusable_lists
from serve_app.harmony.tools import ToolSpec
from serve_app.protocol import mcp_events
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.mcp_items import (
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListedTool,
    McpTool,
)
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.serving.tools.contract import ToolCall, ToolResult

logger = logging.getLogger(__name__)


# --- what the MCP client gives ------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """A server's tools, or why they could not be listed."""

    tools: list[McpListedTool] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class CallOutcome:
    """A call's output text, or its error: ``mcp_error`` the SDK's error object when the
    server said more than a message (a JSON-RPC error's code)."""

    output: str = ""
    error: str | None = None
    mcp_error: Any = None


class McpServers(Protocol):
    """The MCP client as this module uses it (serve_app.serving.tools.mcp adapts to it)."""

    async def list_tools(self, tool: McpTool) -> Listing: ...

    async def call_tool(
        self, tool: McpTool, name: str, arguments: dict[str, Any]
    ) -> CallOutcome: ...


# --- the door ------------------------------------------------------------------------------


def check_mcp_tools(request: ResponsesRequest, args: ToolArgs) -> None:
    """Every ``mcp`` tool names a server this server may reach, by a label no other uses.
    Checked before any connection (the allowlist: serve_app.serving.tools.mcp.policy)."""
    from serve_app.serving.tools.mcp.policy import check_server_url

    labels: set[str] = set()
    for index, tool in enumerate(request.tools):
        if not isinstance(tool, McpTool):
            continue
        param = f"tools[{index}]"
        for unsupported in ("connector_id", "tunnel_id"):
            if getattr(tool, unsupported) is not None:
                raise InvalidRequest(
                    f"Invalid '{param}.{unsupported}': this server reaches MCP servers by "
                    "`server_url` only (no connectors or tunnels).",
                    param=f"{param}.{unsupported}",
                    code="invalid_value",
                )
        if tool.server_label in labels:
            raise InvalidRequest(
                f"Invalid '{param}.server_label': duplicate MCP server label "
                f"'{tool.server_label}'; each mcp tool needs its own.",
                param=f"{param}.server_label",
                code="invalid_value",
            )
        labels.add(tool.server_label)
        if not tool.server_url:
            raise InvalidRequest(
                f"Missing required parameter: '{param}.server_url'.",
                param=f"{param}.server_url",
                code="missing_required_parameter",
            )
        check_server_url(tool.server_url, f"{param}.server_url", args.mcp_allow)


def mcp_tools(request: ResponsesRequest) -> dict[str, McpTool]:
    """The request's ``mcp`` tools by server label."""
    return {tool.server_label: tool for tool in request.tools if isinstance(tool, McpTool)}


# --- before the model runs -----------------------------------------------------------------


@dataclass(frozen=True)
class ServerListing:
    """One server's tools for this response: listed now (``item_id`` set: an
    ``mcp_list_tools`` item goes in the output) or reused from the context."""

    tool: McpTool
    listing: Listing
    item_id: str | None = None


@dataclass(frozen=True)
class ApprovedCall:
    """An approval request the input approves, whose call runs before the model does."""

    request: McpApprovalRequestItem
    tool: McpTool | None
    item_id: str


@dataclass
class McpPlan:
    """What the turn's MCP tools need before the model runs."""

    listings: list[ServerListing] = field(default_factory=list)
    approved: list[ApprovedCall] = field(default_factory=list)

    def specs(self) -> list[ToolSpec]:
        return [
            spec
            for server in self.listings
            if server.listing.error is None
            for spec in listed_specs(server.tool, server.listing.tools)
        ]


async def plan(
    servers: McpServers, request: ResponsesRequest, context: Sequence[InputItem]
) -> McpPlan:
    """Each server's tools (listed concurrently, each bounded by the client's list timeout;
    reused when ``context``, the history and input, holds a listing of its label) and the
    approved calls to run now."""
    tools = mcp_tools(request)
    if not tools:
        return McpPlan()
    known = reusable_lists(context)
    reused = {
        label: ServerListing(tool, Listing(tools=list(known[label].tools)))
        for label, tool in tools.items()
        if label in known
    }
    fresh = [tool for label, tool in tools.items() if label not in known]
    listed = await asyncio.gather(*(_list(servers, tool) for tool in fresh))
    by_label = {**reused, **{server.tool.server_label: server for server in listed}}
    return McpPlan(
        listings=[by_label[label] for label in tools],
        approved=approved_calls(tools, context),
    )


async def _list(servers: McpServers, tool: McpTool) -> ServerListing:
    try:
        listing = await servers.list_tools(tool)
    except Exception as error:  # the client's errors are values; a bug of ours is one too
        logger.exception("MCP server %r not listed", tool.server_label)
        listing = Listing(error=f"The server could not be listed ({type(error).__name__}).")
    return ServerListing(tool, listing, item_id=mcp_events.new_list_id())


def approved_calls(tools: dict[str, McpTool], context: Sequence[InputItem]) -> list[ApprovedCall]:
    """Approval requests the context approves that no ``mcp_call`` ran yet, in order."""
    requests = {item.id: item for item in context if isinstance(item, McpApprovalRequestItem)}
    ran = {
        item.approval_request_id
        for item in context
        if isinstance(item, McpCallItem) and item.approval_request_id
    }
    approved = []
    for item in context:
        if not (isinstance(item, McpApprovalResponseItem) and item.approve):
            continue
        asked = requests.get(item.approval_request_id)
        if asked is None or asked.id in ran:
            continue
        ran.add(asked.id)
        tool = tools.get(asked.server_label)
        approved.append(ApprovedCall(asked, tool, mcp_events.new_call_id()))
    return approved


def check_approvals(context: Sequence[InputItem], first_input: int) -> None:
    """Every ``mcp_approval_response`` of the input answers an approval request in the
    context (a 400 naming it otherwise, as OpenAI answers)."""
    requests = {item.id for item in context if isinstance(item, McpApprovalRequestItem)}
    for index, item in enumerate(context[first_input:]):
        if isinstance(item, McpApprovalResponseItem) and item.approval_request_id not in requests:
            raise InvalidRequest(
                f"No approval request found with id '{item.approval_request_id}'.",
                param=f"input[{index}].approval_request_id",
                code="invalid_value",
            )


# --- running calls -------------------------------------------------------------------------


async def call(servers: McpServers, tool: McpTool | None, name: str, arguments: str) -> ToolResult:
    """One call of ``name`` on ``tool``'s server; never raises (a failure is a result with
    ``error``, which the model reads and the item shows)."""
    if tool is None:
        return ToolResult(error="The request names no MCP server with this call's label.")
    if not tool.allows(name):
        return ToolResult(error=f"The tool '{name}' is not allowed (allowed_tools).")
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError as error:
        return ToolResult(error=f"The arguments are not JSON: {error}")
    if not isinstance(parsed, dict):
        return ToolResult(error="The arguments must be a JSON object.")
    try:
        outcome = await servers.call_tool(tool, name, parsed)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        logger.exception("MCP call %s.%s failed", tool.server_label, name)
        return ToolResult(error=f"The call failed ({type(error).__name__}).")
    if outcome.error is not None:
        data = {"mcp_error": outcome.mcp_error} if outcome.mcp_error is not None else {}
        return ToolResult(error=outcome.error, data=data)
    return ToolResult(output=outcome.output)


class McpRunner:
    """The `ToolRunner` of the kinds ``mcp`` (runs the call) and ``mcp_approval`` (ends the
    response with an ``mcp_approval_request``: the call runs once the client approves it)."""

    def __init__(self, servers: McpServers) -> None:
        self._servers = servers

    async def run(self, call_: ToolCall) -> ToolResult:
        if call_.spec.kind == mcp_events.MCP_APPROVAL_KIND:
            return ToolResult(awaits_client=True)
        tool = mcp_tools(call_.request).get(call_.spec.namespace or "")
        return await call(self._servers, tool, call_.spec.name, call_.arguments)
