"""MCP in the request: the ``mcp`` tool (typed as the openai SDK's ``tool_param.Mcp``) and the
MCP input items (``mcp_list_tools``, ``mcp_call``, ``mcp_approval_request``,
``mcp_approval_response``, as ``response_input_item_param`` types them). No harmony, no Ray.

A tool's ``headers`` and ``authorization`` are the client's credentials for that server: they
are sent to it and nowhere else. `McpTool.echo` is the tool as the Response echoes (and the
store keeps) it: without them (OpenAI does not return the ``authorization`` it was given; we
leave ``headers`` out as well, since they carry credentials as often), and ``repr`` hides them
so no log line can show them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import Field

from serve_app.protocol.request_base import OPAQUE, Lenient

# As requests.ItemId (which imports this module): the longest item id a client may choose.
ItemId = Annotated[str, Field(max_length=256)]

# A label becomes the harmony namespace the model calls (`to=<server_label>.<tool>`).
SERVER_LABEL_PATTERN = r"^[A-Za-z0-9_\-]+$"
# What OpenAI requires without an approval filter: every call needs the client's approval.
DEFAULT_REQUIRE_APPROVAL = "always"


class McpToolFilter(Lenient):
    """``{"tool_names": [...], "read_only": bool}``: the tools a filter matches (by name, or
    by the server's ``readOnlyHint`` annotation)."""

    tool_names: list[str] | None = None
    read_only: bool | None = None

    def matches(self, name: str, read_only: bool) -> bool:
        by_name = self.tool_names is not None and name in self.tool_names
        by_hint = self.read_only is not None and self.read_only == read_only
        return by_name or by_hint


class McpApprovalFilter(Lenient):
    """``require_approval: {"always": filter, "never": filter}``."""

    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


class McpTool(Lenient):
    """``{"type": "mcp", ...}``: a remote MCP server whose tools the server lists, shows the
    model as the namespace ``server_label`` and calls. ``connector_id`` (OpenAI's connectors)
    and ``tunnel_id`` are accepted by the model and refused at the door (a 400 naming them)."""

    type: Literal["mcp"]
    server_label: str = Field(min_length=1, max_length=64, pattern=SERVER_LABEL_PATTERN)
    server_url: str | None = None
    connector_id: str | None = None
    tunnel_id: str | None = None
    allowed_tools: list[str] | McpToolFilter | None = None
    # Credentials: never tokenized (OPAQUE: the text rule passes over them), never shown.
    headers: Annotated[dict[str, str] | None, OPAQUE] = Field(default=None, repr=False)
    authorization: Annotated[str | None, OPAQUE] = Field(default=None, repr=False)
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = None
    server_description: str | None = None
    defer_loading: bool | None = None

    def allows(self, name: str, read_only: bool = False) -> bool:
        """Whether ``allowed_tools`` lets the model see and call the server's tool ``name``."""
        allowed = self.allowed_tools
        if allowed is None:
            return True
        if isinstance(allowed, list):
            return name in allowed
        if allowed.tool_names is not None and name not in allowed.tool_names:
            return False
        return allowed.read_only is None or allowed.read_only == read_only

    def needs_approval(self, name: str, read_only: bool = False) -> bool:
        """Whether a call of ``name`` waits for the client's ``mcp_approval_response``:
        ``never`` lists win over ``always`` ones. A tool neither names needs approval (the
        default), unless the filter lists only ``always`` tools (then only those do)."""
        rule = self.require_approval or DEFAULT_REQUIRE_APPROVAL
        if isinstance(rule, str):
            return rule == "always"
        if rule.never is not None and rule.never.matches(name, read_only):
            return False
        if rule.always is not None and rule.always.matches(name, read_only):
            return True
        return not (rule.always is not None and rule.never is None)

    def echo(self) -> dict[str, Any]:
        """The tool as the Response's ``tools`` shows it (and the store keeps it): what was
        sent, credentials left out."""
        data = self.model_dump(exclude_none=True, exclude={"headers", "authorization"})
        data.setdefault("require_approval", DEFAULT_REQUIRE_APPROVAL)
        return data


# --- input items -------------------------------------------------------------------------


class McpListedTool(Lenient):
    name: str = Field(min_length=1)
    input_schema: dict[str, Any] = Field(default_factory=dict)
    description: str | None = None
    annotations: dict[str, Any] | None = None

    @property
    def read_only(self) -> bool:
        return bool((self.annotations or {}).get("readOnlyHint"))


# The field of an ``mcp_list_tools`` item (ours, beside OpenAI's) holding the server's seal of
# what it listed, for whom: a copy brought back is reused only if the seal still matches.
LISTING_SEAL = "serve_app_seal"


class McpListToolsItem(Lenient):
    """The tools a server listed (once per conversation: a later turn that has this item in
    its context reuses it instead of listing again, if this server sealed it)."""

    type: Literal["mcp_list_tools"]
    server_label: str = Field(min_length=1)
    tools: list[McpListedTool] = Field(default_factory=list)
    error: str | None = None
    id: ItemId | None = None
    # The server's seal (`LISTING_SEAL`): opaque, never tokenized.
    serve_app_seal: Annotated[str | None, OPAQUE] = Field(default=None, repr=False)


class McpCallItem(Lenient):
    """A call the server ran: its arguments and output, or its error (a string, or the
    SDK's ``{type, code, message}`` / ``{type, content}`` object)."""

    type: Literal["mcp_call"]
    server_label: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = ""
    output: str | None = None
    error: str | dict[str, Any] | None = None
    approval_request_id: str | None = None
    status: str | None = None
    id: ItemId | None = None


class McpApprovalRequestItem(Lenient):
    """A call the model made that waits for the client's approval."""

    type: Literal["mcp_approval_request"]
    server_label: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = ""
    id: ItemId = Field(min_length=1)


class McpApprovalResponseItem(Lenient):
    """The client's answer to an ``mcp_approval_request`` (by its id): an approved call runs
    at the start of the response this item is the input of; a denied one is told the model."""

    type: Literal["mcp_approval_response"]
    approval_request_id: str = Field(min_length=1)
    approve: bool
    reason: str | None = None
    id: ItemId | None = None


MCP_ITEM_TYPES = ("mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response")
McpItem = McpListToolsItem | McpCallItem | McpApprovalRequestItem | McpApprovalResponseItem


def error_text(error: str | dict[str, Any] | None) -> str:
    """An ``mcp_call``'s error as the model reads it."""
    if error is None or isinstance(error, str):
        return error or ""
    message = error.get("message")
    if isinstance(message, str):
        return message
    content = error.get("content")
    if isinstance(content, list):
        texts = [part.get("text", "") for part in content if isinstance(part, dict)]
        return "".join(texts)
    return str(content if content is not None else error)


# --- what the server issued: the digests later copies are checked against ---------------


def listing_digest(item: McpListToolsItem, tool: McpTool) -> str:
    """What an ``mcp_list_tools`` item says, for ``tool`` (its label, URL and
    ``allowed_tools``: a listing counts for the same server and filter only): what the
    server's seal of a listing it issued covers, and a client's copy is checked against."""
    listed = [entry.model_dump(mode="json", exclude_none=True) for entry in item.tools]
    allowed = tool.allowed_tools
    if not isinstance(allowed, list | None):
        allowed = allowed.model_dump(mode="json", exclude_none=True)
    return _digest(["mcp_list_tools", item.server_label, tool.server_url, allowed, listed])


def approval_digest(item: McpApprovalRequestItem, tool: McpTool) -> str:
    """What an ``mcp_approval_request`` asks, of ``tool``'s server (its URL: an approval
    counts for the server it was asked for only)."""
    return _digest(
        ["mcp_approval_request", item.server_label, tool.server_url, item.name, item.arguments]
    )


def _digest(parts: list[Any]) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
