"""MCP tools in a turn: each server's listing before the model runs (or the one its context
already holds), the approved calls run at the start of the next response, and the `ToolRunner`
of the ``mcp`` and ``mcp_approval`` kinds (the door's rules: serve_app.serving.admission.mcp).

The MCP client (serve_app.serving.tools.mcp) reaches the servers: this module only decides
what to ask it and what its answers become (items the model and the client read). Nothing here
raises past the door: a server that cannot be listed is a failed ``mcp_list_tools`` item (the
model goes on without its tools), a call that fails an ``mcp_call`` with ``error``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from serve_app.harmony.mcp_tools import listed_specs, reusable_lists
from serve_app.harmony.tools import ToolRegistry, ToolSpec
from serve_app.protocol import mcp_events
from serve_app.protocol.mcp_items import (
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListedTool,
    McpListToolsItem,
    McpTool,
)
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.protocol.stream_events import ResponseEventWriter
from serve_app.protocol.tool_events import ToolCallEvents
from serve_app.serving.tools.bounds import OutputBounds
from serve_app.serving.tools.contract import ToolCall, ToolResult, ToolRunners
from serve_app.serving.tools.mcp.client import CallOutcome, ListOutcome, McpServer

logger = logging.getLogger(__name__)


# --- what the MCP client gives ------------------------------------------------------------


class McpServers(Protocol):
    """The MCP client (serve_app.serving.tools.mcp.client.McpClient) as this module uses it:
    every failure a value (``error``), never an exception."""

    async def list_tools(self, server: McpServer) -> ListOutcome: ...

    async def call_tool(
        self, server: McpServer, name: str, arguments: str | Mapping[str, Any]
    ) -> CallOutcome: ...


def server_of(tool: McpTool) -> McpServer:
    """The server a request's ``mcp`` tool names, with the credentials sent to it only."""
    return McpServer.for_tool(tool.server_url or "", tool.headers, tool.authorization)


def mcp_tools(request: ResponsesRequest) -> dict[str, McpTool]:
    """The request's ``mcp`` tools by server label."""
    return {tool.server_label: tool for tool in request.tools if isinstance(tool, McpTool)}


# --- before the model runs -----------------------------------------------------------------


@dataclass(frozen=True)
class ServerListing:
    """One server's tools for this response: listed now (``fresh``: an ``mcp_list_tools``
    item goes in the output) or reused from the context's listing of its label."""

    tool: McpTool
    outcome: ListOutcome
    fresh: bool = True

    def specs(self) -> list[ToolSpec]:
        if self.outcome.error is not None:
            return []
        listed = [McpListedTool.model_validate(tool.model_dump()) for tool in self.outcome.tools]
        return listed_specs(self.tool, listed)


@dataclass(frozen=True)
class ApprovedCall:
    """An approval request the context approves: its call ran before the model did."""

    asked: McpApprovalRequestItem
    result: ToolResult

    def item(self) -> McpCallItem:
        """The ``mcp_call`` as the model's prompt renders it (after the request it answers)."""
        return McpCallItem(
            type="mcp_call",
            server_label=self.asked.server_label,
            name=self.asked.name,
            arguments=self.asked.arguments,
            output=None if self.result.failed else self.result.output,
            error=self.result.error,
            approval_request_id=self.asked.id,
        )


@dataclass
class McpPrelude:
    """What a response's MCP tools did before the model runs: each server's listing and the
    approved calls, whose items open the response's output."""

    listings: list[ServerListing] = field(default_factory=list)
    approved: list[ApprovedCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.listings or self.approved)

    def specs(self) -> list[ToolSpec]:
        """The servers' tools the model is shown (as `ToolRegistry.from_request` takes them)."""
        return [spec for server in self.listings for spec in server.specs()]

    def rendered_items(self) -> list[InputItem]:
        """What the prompt shows after the request's input: the approved calls' outputs."""
        return [call.item() for call in self.approved]

    def open(self, writer: ResponseEventWriter) -> None:
        """Start the response (``response.created``) and write the items' events after it;
        nothing for a response without them."""
        if self:
            writer.start()
            self.write(writer)

    def write(self, writer: ToolCallEvents) -> None:
        """The items' events, right after ``response.created``: each fresh listing, then each
        approved call (``mcp_call`` with its ``approval_request_id``)."""
        for server in self.listings:
            if not server.fresh:
                continue
            item = writer.open_tool_call(mcp_events.MCP_LIST_KIND, "", server.tool.server_label)
            writer.tool_running(item)
            result = ToolResult(
                error=server.outcome.error, data={"tools": list(server.outcome.tools)}
            )
            writer.close_tool_call(item, result)
        for call in self.approved:
            item = writer.open_tool_call(
                mcp_events.MCP_KIND, call.asked.name, call.asked.server_label
            )
            writer.text(item, call.asked.arguments)
            writer.close(item, "completed")
            for pending in writer.take_pending_calls():
                writer.tool_running(pending)
                writer.close_tool_call(pending, call.result)


async def prelude(
    servers: McpServers,
    request: ResponsesRequest,
    context: Sequence[InputItem],
    bounds: OutputBounds | None = None,
    owner: str | None = None,
) -> McpPrelude:
    """Each server's tools (listed concurrently, within the client's list timeout; reused
    when ``context``, the history and the input, holds a listing of its label), then the calls
    the context approves, run concurrently, each result within ``bounds`` (what the model is
    given of it, as in the tool loop). Never raises: a failure is in an item."""
    tools = mcp_tools(request)
    if not tools:
        return McpPrelude()
    known = reusable_lists(context)
    listings = await asyncio.gather(
        *(
            _reused(tool, known[label]) if label in known else _list(servers, tool)
            for label, tool in tools.items()
        )
    )
    asked = approved_requests(context)
    results = await asyncio.gather(
        *(call(servers, tools.get(item.server_label), item.name, item.arguments) for item in asked)
    )
    if bounds is not None:
        results = await asyncio.gather(
            *(
                _bounded(bounds, item, result, owner)
                for item, result in zip(asked, results, strict=True)
            )
        )
    approved = [
        ApprovedCall(item, replace(result, data={**result.data, "approval_request_id": item.id}))
        for item, result in zip(asked, results, strict=True)
    ]
    return McpPrelude(list(listings), approved)


async def _bounded(
    bounds: OutputBounds, asked: McpApprovalRequestItem, result: ToolResult, owner: str | None
) -> ToolResult:
    """An approved call's result as the model is given it: within ``tools.max_output_tokens``
    and the piece limit (the prompt it joins is rendered, and cut to fit, after)."""
    recipient = f"{asked.server_label}.{asked.name}"
    bounded = await bounds.apply(result, recipient, "commentary", bounds.budget(), owner)
    return bounded.result


async def _reused(tool: McpTool, listing: McpListToolsItem) -> ServerListing:
    tools = [mcp_events.listed_tool(**entry.model_dump()) for entry in listing.tools]
    return ServerListing(tool, ListOutcome(tools=tools), fresh=False)


async def _list(servers: McpServers, tool: McpTool) -> ServerListing:
    try:
        outcome = await servers.list_tools(server_of(tool))
    except asyncio.CancelledError:
        raise
    except Exception as error:  # the client's failures are values; a bug of ours is one too
        logger.exception("MCP server %r not listed", tool.server_label)
        outcome = ListOutcome(error=f"The server could not be listed ({type(error).__name__}).")
    return ServerListing(tool, outcome)


def approved_requests(context: Sequence[InputItem]) -> list[McpApprovalRequestItem]:
    """Approval requests the context approves whose call has not run (no ``mcp_call`` names
    them), in the order of their approvals."""
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
        if asked is not None and asked.id not in ran:
            ran.add(asked.id)
            approved.append(asked)
    return approved


# --- running calls -------------------------------------------------------------------------


async def call(servers: McpServers, tool: McpTool | None, name: str, arguments: str) -> ToolResult:
    """One call of ``name`` on ``tool``'s server; never raises (a failure is a result with
    ``error``, which the model reads and the item shows, the client's error object kept)."""
    if tool is None:
        return ToolResult(error="This request names no MCP server with the call's label.")
    if not tool.allows(name):
        return ToolResult(error=f"The tool '{name}' is not among the allowed_tools.")
    try:
        outcome = await servers.call_tool(server_of(tool), name, arguments)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        logger.exception("MCP call %s.%s failed", tool.server_label, name)
        return ToolResult(error=f"The call failed ({type(error).__name__}).")
    if outcome.error is not None:
        return ToolResult(error=outcome.message, data={"mcp_error": outcome.error})
    return ToolResult(output=outcome.output or "")


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


class McpTurns:
    """MCP for the turns of one ingress replica: the client (its allowlist, bounds and
    per-server slots), the runner the tool loop calls, and what a turn does before the model
    runs (`prepare`)."""

    def __init__(self, servers: McpServers, bounds: OutputBounds | None = None) -> None:
        self.servers = servers
        self.runner = McpRunner(servers)
        # What the model is given of an approved call's result (the loop bounds the others).
        self._bounds = bounds

    def register(self, runners: ToolRunners) -> None:
        """The tool loop runs both MCP kinds' calls with this runner."""
        runners.register(mcp_events.MCP_KIND, self.runner)
        runners.register(mcp_events.MCP_APPROVAL_KIND, self.runner)

    async def prepare(
        self,
        request: ResponsesRequest,
        history: Sequence[InputItem],
        tools: ToolRegistry | None,
        owner: str | None = None,
    ) -> Prepared:
        """What the model's prompt renders (the servers' tools added to ``tools``, the
        approved calls' outputs after the request's input) and the prelude whose items open
        the response. A request without ``mcp`` tools (or with ``tool_choice: none``): as it
        is."""
        if request.tool_choice == "none" or not mcp_tools(request):
            return Prepared(request, tools, McpPrelude())
        context = [*history, *request.input_items]
        done = await prelude(self.servers, request, context, self._bounds, owner)
        shown = request.model_copy(update={"input": [*request.input_items, *done.rendered_items()]})
        tools = tools or ToolRegistry.from_request(request)
        return Prepared(shown, replace(tools, tools=(*tools.tools, *done.specs())), done)


@dataclass(frozen=True)
class Prepared:
    """`McpTurns.prepare`'s answer: the request as rendered (its input extended), the tools
    the model is shown, the prelude."""

    request: ResponsesRequest
    tools: ToolRegistry | None
    prelude: McpPrelude
