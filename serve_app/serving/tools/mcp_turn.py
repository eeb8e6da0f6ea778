"""MCP tools in a turn: each server's listing before the model runs (or the one its context
already holds), the approved calls run at the start of the next response, and the `ToolRunner`
of the ``mcp`` and ``mcp_approval`` kinds (the door's rules: serve_app.serving.admission.mcp).

In two steps, so that nothing runs for a request the server then refuses (issue 46): `plan`,
before the turn is rendered, decides from the request and its context alone what is to be
listed and run; the `McpTurns.stage`, which the event loop runs once an engine took the
response, it is stored (when it is to be) and ``response.created`` is out, does it, streaming
each step as it starts. An approved call runs once whoever asks (`OnceCalls`).

The MCP client (serve_app.serving.tools.mcp) reaches the servers: this module only decides
what to ask it and what its answers become (items the model and the client read). Nothing here
raises past the door: a server that cannot be listed is a failed ``mcp_list_tools`` item (the
model goes on without its tools), a call that fails an ``mcp_call`` with ``error``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from openai.types.responses import Response, ResponseStreamEvent

from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolSpec
from serve_app.protocol import mcp_events
from serve_app.protocol.mcp_items import (
    McpApprovalRequestItem,
    McpTool,
)
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.protocol.stream_events import ResponseEventWriter
from serve_app.protocol.stream_items import OpenItem
from serve_app.protocol.tool_events import ToolCallEvents
from serve_app.serving.tools import mcp_trust
from serve_app.serving.tools.bounds import OutputBounds
from serve_app.serving.tools.contract import (
    CancelScope,
    RunnerServer,
    ToolCall,
    ToolContext,
    ToolDescription,
    ToolResult,
    ToolSession,
)
from serve_app.serving.tools.loop import over_cap
from serve_app.serving.tools.mcp.client import CallOutcome, ListOutcome, McpServer
from serve_app.serving.tools.mcp_once import OnceCalls
from serve_app.serving.tools.mcp_plan import (
    ApprovedCall,
    McpDone,
    McpPlan,
    ServerListing,
    plan,
)
from serve_app.serving.tools.mcp_trust import TrustedMcp, mcp_tools

logger = logging.getLogger(__name__)


# --- what the MCP client gives ------------------------------------------------------------


class McpServers(Protocol):
    """The MCP client (serve_app.serving.tools.mcp.client.McpClient) as this module uses it:
    every failure a value (``error``), never an exception."""

    async def list_tools(self, server: McpServer) -> ListOutcome: ...

    def listed_before(self, server: McpServer) -> ListOutcome | None: ...

    async def call_tool(
        self, server: McpServer, name: str, arguments: str | Mapping[str, Any]
    ) -> CallOutcome: ...


def server_of(tool: McpTool, owner: str | None) -> McpServer:
    """The server a request's ``mcp`` tool names, with the credentials sent to it only, for
    ``owner`` (sessions and the bound on calls in flight are per owner)."""
    return McpServer.for_tool(tool.server_url or "", tool.headers, tool.authorization, owner)


# --- before the model runs: the stage (after the response exists), of the plan (mcp_plan.py)


class StageTurn(Protocol):
    """What the stage reads of a turn (`serving.turn.state.Turn`, named by its shape)."""

    request: ResponsesRequest
    translator: ResponseStreamTranslator
    owner: str | None
    server_calls: int

    @property
    def response(self) -> Response: ...


async def _list(servers: McpServers, tool: McpTool, owner: str | None) -> ServerListing:
    try:
        outcome = await servers.list_tools(server_of(tool, owner))
    except asyncio.CancelledError:
        raise
    except Exception as error:  # the client's failures are values; a bug of ours is one too
        logger.exception("MCP server %r not listed", tool.server_label)
        outcome = ListOutcome(error=f"The server could not be listed ({type(error).__name__}).")
    return ServerListing(tool, outcome)


# --- running calls -------------------------------------------------------------------------


async def call(
    servers: McpServers,
    tool: McpTool | None,
    name: str,
    arguments: str,
    *,
    owner: str | None,
    read_only: bool = False,
) -> ToolResult:
    """One call of ``name`` on ``tool``'s server (``read_only``: the tool's listing says it
    only reads); never raises (a failure is a result with ``error``, which the model reads
    and the item shows, the client's error object kept)."""
    if tool is None:
        return ToolResult(error="This request names no MCP server with the call's label.")
    if not tool.allows(name, read_only):
        return ToolResult(error=f"The tool '{name}' is not among the allowed_tools.")
    try:
        outcome = await servers.call_tool(server_of(tool, owner), name, arguments)
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
        spec = call_.spec
        tool = mcp_tools(call_.request).get(spec.namespace or "")
        return await call(
            self._servers,
            tool,
            spec.name,
            call_.arguments,
            owner=call_.owner,
            read_only=spec.read_only,
        )


class McpTurns:
    """MCP for the turns of one ingress replica: the client (its allowlist, bounds and
    per-server slots), the runner the tool loop calls, the plan a turn makes before it is
    rendered and the stage it runs once its response exists (`stage`)."""

    def __init__(
        self,
        servers: McpServers,
        once: OnceCalls,
        max_calls: int,
        vault: ReasoningVault,
        bounds: OutputBounds | None = None,
    ) -> None:
        self.servers = servers
        self.runner = McpRunner(servers)
        self._once = once
        self._vault = vault  # seals the listings it makes (mcp_trust.py)
        # The server's bound on the calls one response runs (approved ones are among them).
        self._max_calls = max_calls
        # What the model is given of an approved call's result (the loop bounds the others).
        self._bounds = bounds

    def plan(
        self,
        request: ResponsesRequest,
        context: Sequence[InputItem],
        trusted: TrustedMcp,
        owner: str | None,
        *,
        guess: bool = True,
    ) -> McpPlan:
        """`plan`; ``guess``: each server to list guessed by what the owner's session listed
        last (a turn's prompt), or not (a token count: no server's state in it)."""

        def last(tool: McpTool) -> ListOutcome | None:
            return self.servers.listed_before(server_of(tool, owner)) if guess else None

        return plan(request, context, trusted, last)

    async def stage(
        self, turn: StageTurn, planned: McpPlan, done: McpDone
    ) -> AsyncIterator[list[ResponseStreamEvent]]:
        """The plan's work, once the response exists (an engine took it, it is stored,
        ``response.created`` is out): each listing to make, then each approved call, every
        step's events as it starts (``in_progress`` before the work) and as it ends (in the
        plan's order, whatever order they finish in). ``done`` holds what it did. Leaving early
        (the client went away) cancels what still runs."""
        writer = turn.translator.writer
        scope = CancelScope()
        tasks: list[asyncio.Task[Any]] = []
        try:
            items = [_open_listing(writer, tool) for tool in planned.to_list]
            if items:
                yield writer.take_events()
            tasks = [scope.spawn(_list(self.servers, tool, turn.owner)) for tool in planned.to_list]
            for item, task in zip(items, tasks, strict=True):
                listing = await task
                done.listed[listing.tool.server_label] = listing
                writer.close_tool_call(item, self._listing_result(listing, turn.owner))
                yield writer.take_events()
            calls = [_open_approved(writer, asked) for asked in planned.approved]
            if calls:
                yield writer.take_events()
            tasks = [
                scope.spawn(self._approved(turn, planned, done, asked, self._may_run(turn)))
                for asked in planned.approved
            ]
            for item, asked, task in zip(calls, planned.approved, tasks, strict=True):
                result = await task
                done.approved.append(ApprovedCall(asked, result))
                writer.close_tool_call(item, result)
                yield writer.take_events()
        finally:
            if any(not task.done() for task in tasks):
                scope.cancel("the response ended")
                await asyncio.gather(*tasks, return_exceptions=True)

    def _listing_result(self, listing: ServerListing, owner: str | None) -> ToolResult:
        """The listing's item: the tools ``allowed_tools`` lets through (OpenAI imports only
        those), sealed for ``owner``; or its error."""
        if listing.outcome.error is not None:
            return ToolResult(error=listing.outcome.error)
        tools = listing.allowed()
        seal = mcp_trust.seal_listing(self._vault, owner, listing.tool, tools)
        return ToolResult(data={"tools": tools, "seal": seal})

    def _may_run(self, turn: StageTurn) -> int | None:
        """None when one more call may run (counted), else the bound it would pass: the
        request's ``max_tool_calls`` and the server's."""
        asked = turn.request.max_tool_calls
        limit = self._max_calls if asked is None else min(asked, self._max_calls)
        if turn.server_calls >= limit:
            return limit
        turn.server_calls += 1
        return None

    async def _approved(
        self,
        turn: StageTurn,
        planned: McpPlan,
        done: McpDone,
        asked: McpApprovalRequestItem,
        over: int | None,
    ) -> ToolResult:
        """The approved call's result: run now if this response is the first to claim it,
        else the result of the run that was; not run (nor claimed: another request may run
        it) past the response's bound on calls (``over``)."""
        if over is not None:
            return ToolResult(error=over_cap(over), data={"approval_request_id": asked.id})
        tool = planned.tools.get(asked.server_label)
        read_only = planned.read_only(asked.server_label, asked.name, done)

        async def run() -> ToolResult:
            result = await call(
                self.servers,
                tool,
                asked.name,
                asked.arguments,
                owner=turn.owner,
                read_only=read_only,
            )
            # Bounded before it is recorded: a retry is given what the model was.
            return await self._bounded(asked, result, turn.owner)

        result = await self._once.run(turn.owner, asked.id, turn.response.id, run)
        return replace(result, data={**result.data, "approval_request_id": asked.id})

    async def _bounded(
        self, asked: McpApprovalRequestItem, result: ToolResult, owner: str | None
    ) -> ToolResult:
        """An approved call's result as the model is given it: within
        ``tools.max_output_tokens`` and the piece limit (the prompt it joins is rendered, and
        cut to fit, after)."""
        if self._bounds is None:
            return result
        recipient = f"{asked.server_label}.{asked.name}"
        bounds = self._bounds
        bounded = await bounds.apply(result, recipient, "commentary", bounds.budget(), owner)
        return bounded.result


def _open_listing(writer: ToolCallEvents, tool: McpTool) -> OpenItem:
    """An ``mcp_list_tools`` item, announced and in progress before the server is asked."""
    item = writer.open_tool_call(mcp_events.MCP_LIST_KIND, "", tool.server_label)
    writer.tool_running(item)
    return item


def _open_approved(writer: ResponseEventWriter, asked: McpApprovalRequestItem) -> OpenItem:
    """The approved call's ``mcp_call`` item, its arguments whole, running: before it runs."""
    item = writer.open_tool_call(mcp_events.MCP_KIND, asked.name, asked.server_label)
    writer.text(item, asked.arguments)
    # Its arguments are whole: pending until the stage closes it (or, should the response end
    # first, the end closes it incomplete).
    writer.close(item, "completed")
    writer.tool_running(item)
    return item


class McpStage:
    """The MCP servers' `ToolStage`: the plan's listings and approved calls (`McpTurns.stage`)."""

    def __init__(self, turns: McpTurns, planned: McpPlan) -> None:
        self._turns = turns
        self._planned = planned
        self._done = McpDone()

    def __bool__(self) -> bool:
        return bool(self._planned)

    def run(self, turn: StageTurn) -> AsyncIterator[list[ResponseStreamEvent]]:
        return self._turns.stage(turn, self._planned, self._done)

    def specs(self) -> list[ToolSpec]:
        return self._planned.specs(self._done)

    def rendered_items(self) -> list[InputItem]:
        return self._done.rendered_items()

    def changed_prompt(self) -> bool:
        return not self._planned.rendered_as_done(self._done)


class McpToolServer:
    """MCP servers as a `ToolServer`: a request's ``mcp`` tools; described by their listings
    (reused from the context, guessed from the session's last, made by the stage); their
    calls run by `McpRunner` (one session per owner and server, the client's pool's)."""

    kinds = frozenset({mcp_events.MCP_KIND, mcp_events.MCP_APPROVAL_KIND})

    def __init__(self, turns: McpTurns) -> None:
        self._turns = turns

    def has(self, request: ResponsesRequest) -> bool:
        return bool(mcp_tools(request))

    async def describe(self, context: ToolContext) -> ToolDescription:
        planned = self._turns.plan(
            context.request,
            context.items,
            context.trusted,
            context.owner,
            guess=context.generating,
        )
        stage = McpStage(self._turns, planned) if context.generating and planned else None
        return ToolDescription(planned.specs(), stage)

    def session(self, owner: str | None, response_id: str) -> ToolSession:
        return RunnerServer(mcp_events.MCP_KIND, self._turns.runner).session(owner, response_id)
