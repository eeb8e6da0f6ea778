"""MCP servers as harmony sees them: each server's tools a namespace named by its
``server_label`` (the model calls ``to=<server_label>.<tool>``, with the full input schema
shown as function tools are), and the MCP items of a history as the messages they were.

- ``mcp_list_tools``: no message; its tools are in the developer message (a later turn that
  has it in its context shows those tools without listing the server again: `reusable_lists`).
- ``mcp_call``: the model's call (``<server_label>.<name>``, JSON arguments) and the tool's
  message with the output, or the error; a call that ran after an approval shows only its
  output, right after the approval request it answers.
- ``mcp_approval_request``: the model's call; then, when the client denied it (or never
  answered), a tool message saying the call did not run.
- ``mcp_approval_response``: no message of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from openai_harmony import Author, Message, Role

from serve_app.harmony.tools import ToolSpec
from serve_app.protocol import mcp_events  # registers the MCP kinds' items
from serve_app.protocol.mcp_items import (
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListedTool,
    McpListToolsItem,
    McpTool,
    error_text,
)

DENIED = "The user denied this tool call: it did not run."
UNANSWERED = "This tool call was not approved: it did not run."
_JSON = "<|constrain|>json"


def listed_specs(tool: McpTool, listed: Sequence[McpListedTool]) -> list[ToolSpec]:
    """The server's tools the model sees (those ``allowed_tools`` lets through): of the kind
    ``mcp_approval`` when a call waits for the client's approval, else ``mcp``."""
    return [
        ToolSpec(
            name=entry.name,
            kind=(
                mcp_events.MCP_APPROVAL_KIND
                if tool.needs_approval(entry.name, entry.read_only)
                else mcp_events.MCP_KIND
            ),
            description=entry.description or "",
            parameters=entry.input_schema or {"type": "object", "properties": {}},
            namespace=tool.server_label,
            read_only=entry.read_only,
        )
        for entry in listed
        if tool.allows(entry.name, entry.read_only)
    ]


def reusable_lists(items: Iterable[object]) -> dict[str, McpListToolsItem]:
    """The latest successful ``mcp_list_tools`` of each server label among ``items``."""
    found: dict[str, McpListToolsItem] = {}
    for item in items:
        if isinstance(item, McpListToolsItem) and not item.error:
            found[item.server_label] = item
    return found


class McpHistory:
    """Renders the MCP items of one context (approvals are paired across it)."""

    def __init__(self, items: Sequence[object]) -> None:
        self._answers: dict[str, McpApprovalResponseItem] = {}
        self._requests: set[str] = set()
        for item in items:
            if isinstance(item, McpApprovalResponseItem):
                self._answers[item.approval_request_id] = item
            elif isinstance(item, McpApprovalRequestItem):
                self._requests.add(item.id)
        self._ran = {
            item.approval_request_id
            for item in items
            if isinstance(item, McpCallItem) and item.approval_request_id
        }

    def messages(self, item: object) -> list[Message]:
        if isinstance(item, McpCallItem):
            shown = [] if item.approval_request_id in self._requests else [_call(item)]
            return [*shown, _result(item, _call_output(item))]
        if isinstance(item, McpApprovalRequestItem):
            answer = self._answers.get(item.id)
            if answer is not None and answer.approve:
                # Its output comes with the mcp_call that ran it (none yet: it runs now).
                return [_call(item)]
            if item.id in self._ran:
                return [_call(item)]
            note = UNANSWERED if answer is None else DENIED
            if answer is not None and answer.reason:
                note += f" Reason: {answer.reason}"
            return [_call(item), _result(item, note)]
        return []  # mcp_list_tools, mcp_approval_response


def _recipient(item: McpCallItem | McpApprovalRequestItem) -> str:
    return f"{item.server_label}.{item.name}"


def _call(item: McpCallItem | McpApprovalRequestItem) -> Message:
    return (
        Message.from_role_and_content(Role.ASSISTANT, item.arguments or "{}")
        .with_channel("commentary")
        .with_recipient(_recipient(item))
        .with_content_type(_JSON)
    )


def _call_output(item: McpCallItem) -> str:
    if item.error:
        return f"Error: {error_text(item.error)}"
    return item.output or ""


def _result(item: McpCallItem | McpApprovalRequestItem, text: str) -> Message:
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, _recipient(item)), text)
        .with_channel("commentary")
        .with_recipient("assistant")
    )
