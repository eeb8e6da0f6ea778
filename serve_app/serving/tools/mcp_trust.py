"""Which MCP items of a request's context this server issued to the request's owner (issue 46):
an ``mcp_list_tools`` (its tools are reused instead of listing the server again) and an
``mcp_approval_request`` (its approval runs the call) count only then, as they were, for the
server (label and URL) the request names now. A client writes ``input``, and a stored chain or
conversation holds the client's inputs too: so whatever an item's place, it is checked.

- **A listing** carries the server's seal of what it said, for whom (`seal_listing`: an HMAC
  under the reasoning key, bound to the owner, over the label, the URL, ``allowed_tools`` and
  the tools; in the item's ``serve_app_seal`` field, beside OpenAI's), as encrypted reasoning
  is sealed: nothing is kept on the server. A listing without it (written by a client, from
  another key or server, changed since: a ``readOnlyHint`` turned on) is not reused: the
  server lists again. A client that drops the field costs a listing, nothing more.
- **An approval request** must run with any client, which sends back its id only: the store
  keeps a digest of each one a response issued (serve_app/store/issued_items.py; written with
  the response, or alone for ``store: false``), and an approval counts when the copy in the
  context matches it. Read only for the requests an approval in the input names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openai.types.responses.response_output_item import McpListToolsTool

from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.mcp_items import (
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpListToolsItem,
    McpTool,
    approval_digest,
    listing_digest,
)
from serve_app.protocol.requests import ResponsesRequest
from serve_app.store.base import IssuedItem, ResponseStore

LISTING_PURPOSE = b"mcp_list_tools"


def mcp_tools(request: ResponsesRequest) -> dict[str, McpTool]:
    """The request's ``mcp`` tools by server label."""
    return {tool.server_label: tool for tool in request.tools if isinstance(tool, McpTool)}


@dataclass(frozen=True)
class TrustedMcp:
    """The ids of the context's MCP items this server issued to the owner, as they were."""

    listings: frozenset[str] = frozenset()
    approvals: frozenset[str] = frozenset()


def seal_listing(
    vault: ReasoningVault, owner: str | None, tool: McpTool, tools: Sequence[McpListToolsTool]
) -> str:
    """The seal of a listing of ``tool``'s server made for ``owner`` (its item's tools)."""
    item = McpListToolsItem.model_validate(
        {
            "type": "mcp_list_tools",
            "server_label": tool.server_label,
            "tools": [entry.model_dump(mode="json") for entry in tools],
        }
    )
    return vault.sign(listing_digest(item, tool).encode(), LISTING_PURPOSE, owner)


async def trusted(
    store: ResponseStore,
    vault: ReasoningVault,
    owner: str | None,
    request: ResponsesRequest,
    items: Sequence[object],
    first_input: int,
) -> TrustedMcp:
    """The context's (``items``: history, then the input from ``first_input``) listings and
    approval requests that count: the listings by their seals, the approval requests an
    approval in the input names by one read of the store (none when there is none)."""
    tools = mcp_tools(request)
    if not tools:
        return TrustedMcp()
    return TrustedMcp(
        listings=_sealed_listings(vault, owner, tools, items),
        approvals=await _issued_approvals(store, owner, tools, items, first_input),
    )


def _sealed_listings(
    vault: ReasoningVault, owner: str | None, tools: dict[str, McpTool], items: Sequence[object]
) -> frozenset[str]:
    found = set()
    for item in items:
        if not (isinstance(item, McpListToolsItem) and item.id and item.serve_app_seal):
            continue
        tool = tools.get(item.server_label)
        digest = listing_digest(item, tool).encode() if tool and not item.error else None
        if digest and vault.verify(item.serve_app_seal, digest, LISTING_PURPOSE, owner):
            found.add(item.id)
    return frozenset(found)


async def _issued_approvals(
    store: ResponseStore,
    owner: str | None,
    tools: dict[str, McpTool],
    items: Sequence[object],
    first_input: int,
) -> frozenset[str]:
    approving = {
        item.approval_request_id
        for item in items[first_input:]
        if isinstance(item, McpApprovalResponseItem) and item.approve
    }
    wanted: dict[str, str] = {}
    for item in items:
        if isinstance(item, McpApprovalRequestItem) and item.id in approving:
            tool = tools.get(item.server_label)
            if tool is not None:
                wanted[item.id] = approval_digest(item, tool)
    if not wanted:
        return frozenset()
    issued = await store.issued_digests(owner, wanted.keys())
    return frozenset(item_id for item_id, digest in wanted.items() if issued.get(item_id) == digest)


def issued(request: ResponsesRequest, output: Sequence[dict[str, Any]]) -> list[IssuedItem]:
    """The approval requests of a response's ``output`` (wire JSON), with their digests: what
    the store keeps, so that their approvals count."""
    tools = mcp_tools(request)
    found: list[IssuedItem] = []
    for data in output if tools else ():
        if data.get("type") != "mcp_approval_request":
            continue
        item = McpApprovalRequestItem.model_validate(data)
        tool = tools.get(item.server_label)
        if tool is not None:
            found.append(IssuedItem(item.id, approval_digest(item, tool)))
    return found
