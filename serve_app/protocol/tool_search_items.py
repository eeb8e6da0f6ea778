"""``tool_search``'s output items, as the tool loop writes them (tool_items.py's contract): a
``tool_search_call`` (`ResponseToolSearchCall`) for the model's search, and, when the server
answers it, a ``tool_search_output`` (`ResponseToolSearchOutputItem`) with the tools found,
right after it. The openai SDK defines no stream events of their own: only
``output_item.added`` and ``output_item.done``. No harmony, no Ray.

Kinds: ``tool_search`` (execution ``server``: run here) and ``tool_search_client`` (execution
``client``: its call ends the response; the client answers with a ``tool_search_output`` input
item).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from openai.types.responses import (
    ResponseOutputItem,
    ResponseStreamEvent,
    ResponseToolSearchCall,
    ResponseToolSearchOutputItem,
)

from serve_app.protocol import responses as builders
from serve_app.protocol.stream_items import OpenItem
from serve_app.protocol.tool_items import (
    ItemStatus,
    QuietEvents,
    ToolResult,
    register_tool_items,
)

SERVER_KIND = "tool_search"
CLIENT_KIND = "tool_search_client"


class ToolSearchItems(QuietEvents):
    """One execution's ``tool_search_call`` items (and the server's ``tool_search_output``)."""

    id_prefix = builders.ITEM_ID_PREFIXES["tool_search_call"]

    def __init__(self, execution: Literal["server", "client"]) -> None:
        self.execution = execution

    def added(self, item: OpenItem) -> ResponseOutputItem:
        return self._call(item, {}, "in_progress")

    def done(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus
    ) -> tuple[list[ResponseStreamEvent], ResponseOutputItem]:
        # The call itself completed once the model wrote it whole; a search that failed says
        # so in its output (the model reads the error there).
        final = "completed" if result is not None else status
        return [], self._call(item, arguments(item.text), final)

    def follow_up(self, item: OpenItem, result: ToolResult) -> ResponseOutputItem | None:
        """The server's answer, its own item after the call (none for the client's search)."""
        if self.execution != "server":
            return None
        return ResponseToolSearchOutputItem.model_validate(
            {
                "id": builders.new_item_id(builders.ITEM_ID_PREFIXES["tool_search_output"]),
                "type": "tool_search_output",
                "call_id": item.call_id,
                "execution": "server",
                "status": "incomplete" if result.failed else "completed",
                "tools": list(result.data.get("tools", ())),
            }
        )

    def _call(self, item: OpenItem, parsed: Any, status: str) -> ResponseToolSearchCall:
        return ResponseToolSearchCall(
            id=item.item_id,
            type="tool_search_call",
            call_id=item.call_id,
            execution=self.execution,
            arguments=parsed,
            status=status,  # type: ignore[arg-type]
        )


def arguments(text: str) -> Any:
    """The model's arguments as the item's JSON value (``{}`` for none; text that is not JSON
    kept as the string it is)."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text


register_tool_items(SERVER_KIND, ToolSearchItems("server"))
register_tool_items(CLIENT_KIND, ToolSearchItems("client"))
