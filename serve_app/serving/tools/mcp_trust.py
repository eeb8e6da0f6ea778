"""Which MCP items of a request's context this server issued to the request's owner (issue 46):
an ``mcp_list_tools`` (its tools are reused instead of listing the server again) and an
``mcp_approval_request`` (its approval runs the call) count only then. A client writes
``input``, and a stored chain or conversation holds the client's inputs too; so whatever the
item's place, it counts when the store holds a digest of it, recorded for this owner by the
response that issued it (serve_app/store/issued_items.py), and the copy in the context still
says the same, for the server (label and URL) the request names now: a listing of another URL,
or with tools changed (a ``readOnlyHint`` turned on), is not reused; an approval request the
server never asked (or asked of another server) runs nothing.

The same for ``store: false``: the digests are kept, not the items (their content stays with
the client), for the store's retention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from serve_app.protocol.mcp_items import (
    McpApprovalRequestItem,
    McpListToolsItem,
    McpTool,
    approval_digest,
    listing_digest,
)
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.store.base import IssuedItem, ResponseStore


def mcp_tools(request: ResponsesRequest) -> dict[str, McpTool]:
    """The request's ``mcp`` tools by server label."""
    return {tool.server_label: tool for tool in request.tools if isinstance(tool, McpTool)}


@dataclass(frozen=True)
class TrustedMcp:
    """The ids of the context's MCP items this server issued to the owner, as they were."""

    listings: frozenset[str] = frozenset()
    approvals: frozenset[str] = frozenset()


def _digest(item: object, tools: dict[str, McpTool]) -> tuple[str, str] | None:
    """(id, digest) of an item that could count, for the tool of its label; None otherwise."""
    if isinstance(item, McpListToolsItem) and item.id and not item.error:
        tool = tools.get(item.server_label)
        return (item.id, listing_digest(item, tool)) if tool else None
    if isinstance(item, McpApprovalRequestItem):
        tool = tools.get(item.server_label)
        return (item.id, approval_digest(item, tool)) if tool else None
    return None


async def trusted(
    store: ResponseStore, owner: str | None, request: ResponsesRequest, items: Sequence[object]
) -> TrustedMcp:
    """The context's (``items``: history and input) listings and approval requests that count:
    one read of the store, none for a request without ``mcp`` tools or such items."""
    tools = mcp_tools(request)
    if not tools:
        return TrustedMcp()
    wanted: dict[str, tuple[str, object]] = {}
    for item in items:
        found = _digest(item, tools)
        if found is not None:
            wanted[found[0]] = (found[1], item)
    if not wanted:
        return TrustedMcp()
    issued = await store.issued_digests(owner, wanted.keys())
    ok = [item for item_id, (digest, item) in wanted.items() if issued.get(item_id) == digest]
    return TrustedMcp(
        listings=frozenset(i.id for i in ok if isinstance(i, McpListToolsItem) and i.id),
        approvals=frozenset(i.id for i in ok if isinstance(i, McpApprovalRequestItem)),
    )


def issued(request: ResponsesRequest, output: Sequence[dict[str, Any]]) -> list[IssuedItem]:
    """The items of a response's ``output`` (wire JSON) a later request may bring back and
    rely on: its listings (those that listed) and approval requests, with their digests."""
    tools = mcp_tools(request)
    if not tools:
        return []
    found: list[IssuedItem] = []
    for data in output:
        item: InputItem | None = None
        if data.get("type") == "mcp_list_tools":
            item = McpListToolsItem.model_validate(data)
        elif data.get("type") == "mcp_approval_request":
            item = McpApprovalRequestItem.model_validate(data)
        digest = _digest(item, tools) if item is not None else None
        if digest is not None:
            found.append(IssuedItem(*digest))
    return found
