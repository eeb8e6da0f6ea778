"""What a response's MCP tools need before the model runs, decided from the request and its
context alone, with no I/O (issue 46): each server's listing, reused from the context (if this
server issued it: serve_app/serving/tools/mcp_trust.py), guessed from the owner's session's
last, or to be made; and the approved calls to run. The stage that does it, once the response
exists, is `McpTurns.stage` (mcp_turn.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from openai.types.responses.response_output_item import McpListToolsTool

from serve_app.harmony.mcp_tools import listed_specs, reusable_lists
from serve_app.harmony.tools import ToolSpec
from serve_app.protocol.mcp_items import (
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListedTool,
    McpListToolsItem,
    McpTool,
)
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.protocol.tool_items import ToolResult
from serve_app.serving.tools.mcp.client import ListOutcome
from serve_app.serving.tools.mcp_trust import TrustedMcp, mcp_tools


@dataclass(frozen=True)
class ApprovedCall:
    """An approval request the context approves, and its call's result (run once: the first
    request to claim it ran it, serve_app.serving.tools.mcp_once)."""

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


@dataclass(frozen=True)
class McpPlan:
    """What a response's MCP tools need before the model runs, decided from the request and its
    context alone (no I/O, so nothing runs for a request the server then refuses): each
    server's listing, reused from the context or to be made, and the approved calls to run."""

    tools: dict[str, McpTool] = field(default_factory=dict)
    # The context's listing of a label, reused (no item of its own in the output).
    listings: dict[str, McpListToolsItem] = field(default_factory=dict)
    approved: list[McpApprovalRequestItem] = field(default_factory=list)
    # For a server to list: what the owner's session with it listed last, within its TTL
    # (`McpClient.listed_before`). The prompt is rendered with it before the listing; if the
    # listing says the same (and no approved call runs), that prompt stands: rendered once.
    guessed: dict[str, ServerListing] = field(default_factory=dict)

    @property
    def to_list(self) -> list[McpTool]:
        return [tool for label, tool in self.tools.items() if label not in self.listings]

    def __bool__(self) -> bool:
        """Whether anything runs before the model (a listing to make, a call to run)."""
        return bool(self.to_list or self.approved)

    def read_only(self, label: str, name: str, done: McpDone) -> bool:
        """Whether the server's listing (reused, or made by the stage) says ``name`` only
        reads."""
        if label in self.listings:
            listed = self.listings[label].tools
        elif label in done.listed:
            listed = done.listed[label].listed()
        else:
            return False
        return any(entry.name == name and entry.read_only for entry in listed)

    def specs(self, done: McpDone | None = None) -> list[ToolSpec]:
        """The servers' tools the model is shown, in the request's order of its ``mcp`` tools
        (the order a later turn reusing every listing shows them in): the listings reused,
        and those ``done`` made; without ``done`` (before the stage), those guessed."""
        specs: list[ToolSpec] = []
        for label, tool in self.tools.items():
            if label in self.listings:
                specs += listed_specs(tool, self.listings[label].tools)
            elif done is not None and label in done.listed:
                specs += done.listed[label].specs()
            elif done is None and label in self.guessed:
                specs += self.guessed[label].specs()
        return specs

    def rendered_as_done(self, done: McpDone) -> bool:
        """Whether the prompt rendered before the stage shows what it did: every guess right,
        no approved call's output to show."""
        return not done.approved and self.specs() == self.specs(done)


@dataclass(frozen=True)
class ServerListing:
    """One server's tools, listed for this response."""

    tool: McpTool
    outcome: ListOutcome

    def listed(self) -> list[McpListedTool]:
        return [McpListedTool.model_validate(tool.model_dump()) for tool in self.outcome.tools]

    def allowed(self) -> list[McpListToolsTool]:
        """The server's tools ``allowed_tools`` lets through."""
        return [
            tool
            for tool, entry in zip(self.outcome.tools, self.listed(), strict=True)
            if self.tool.allows(entry.name, entry.read_only)
        ]

    def specs(self) -> list[ToolSpec]:
        if self.outcome.error is not None:
            return []
        return listed_specs(self.tool, self.listed())


@dataclass
class McpDone:
    """What the stage did: the servers it listed, the approved calls it ran."""

    listed: dict[str, ServerListing] = field(default_factory=dict)
    approved: list[ApprovedCall] = field(default_factory=list)

    def rendered_items(self) -> list[InputItem]:
        """What the prompt shows after the request's input: the approved calls' outputs."""
        return [call.item() for call in self.approved]


def plan(
    request: ResponsesRequest,
    context: Sequence[InputItem],
    trusted: TrustedMcp,
    guess: Callable[[McpTool], ListOutcome | None] = lambda _: None,
) -> McpPlan:
    """The plan of a request whose ``context`` (history and input) is known: nothing for a
    request without ``mcp`` tools or with ``tool_choice: none``. Only the items ``trusted``
    names count (those this server issued to the owner, as they were): a listing reused, an
    approval request whose approval runs its call. ``guess``: a server's last listing, if
    known, for the prompt rendered before it is listed again."""
    tools = mcp_tools(request)
    if request.tool_choice == "none" or not tools:
        return McpPlan()
    known = reusable_lists(item for item in context if _in(item, trusted.listings))
    listings = {label: known[label] for label in tools if label in known}
    asked = [
        item
        for item in context
        if not isinstance(item, McpApprovalRequestItem) or _in(item, trusted.approvals)
    ]
    guessed = {}
    for label, tool in tools.items():
        last = guess(tool) if label not in listings else None
        if last is not None and last.error is None:
            guessed[label] = ServerListing(tool, last)
    return McpPlan(tools, listings, approved_requests(asked), guessed)


def _in(item: object, ids: frozenset[str]) -> bool:
    return getattr(item, "id", None) in ids


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
