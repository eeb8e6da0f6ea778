"""The writer's part for items no completion streams as text (`ResponseEventWriter` mixes it
in, stream_events.py): a server-side compaction's item, announced before the answer and done
once its summary is sealed, and the items a client commits into a response (a WebSocket
``response.inject``'s tool outputs), whole already. No harmony, no Ray."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from openai.types.responses import (
    ResponseCompactionCompactingEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseStreamEvent,
)

from serve_app.protocol import responses as builders
from serve_app.protocol.stream_items import ItemKind, OpenItem, compaction_item


class WholeItemWriting:
    """`ResponseEventWriter`'s part for a compaction item and the items made whole at once (the
    items the client put in, a server-run tool's own result item)."""

    if TYPE_CHECKING:  # the writer's own state and helpers
        _events: list[ResponseStreamEvent]

        def _seq(self) -> int: ...
        def _output_index(self) -> int: ...
        def _item_done(self, output_index: int, item: ResponseOutputItem) -> None: ...

    # --- server-side compaction ----------------------------------------------------------

    def open_compaction(self) -> OpenItem:
        """A ``compaction`` item, before the answer: ``output_item.added`` (its
        ``encrypted_content`` empty until the summary is sealed)."""
        item = OpenItem(ItemKind.COMPACTION, builders.new_compaction_id(), self._output_index())
        self._events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                output_index=item.output_index,
                item=compaction_item(item, ""),
                sequence_number=self._seq(),
            )
        )
        return item

    def compacting(self, item: OpenItem) -> None:
        """``response.compaction.compacting``: more of the summary was sampled (it carries
        none of it)."""
        self._events.append(
            ResponseCompactionCompactingEvent(
                type="response.compaction.compacting",
                item_id=item.item_id,
                output_index=item.output_index,
                sequence_number=self._seq(),
            )
        )

    def close_compaction(self, item: OpenItem, encrypted_content: str) -> None:
        """``output_item.done`` with the sealed summary; the item is in ``output`` from now."""
        final = compaction_item(item, encrypted_content)
        self._item_done(item.output_index, final)

    # --- items the client put in (response.inject) ------------------------------------------

    def place(self, items: Sequence[ResponseOutputItem]) -> None:
        """Items the client committed into the response (a WebSocket ``response.inject``'s
        tool outputs), whole already: each at the next output index, as every item is
        announced."""
        for item in items:
            self._whole_item(item)

    def _whole_item(self, final: ResponseOutputItem) -> None:
        """An item made whole at once (one the client put in, the server's
        ``tool_search_output``): ``output_item.added`` then ``output_item.done`` with the same
        complete item."""
        index = self._output_index()
        self._events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                output_index=index,
                item=final,
                sequence_number=self._seq(),
            )
        )
        self._item_done(index, final)
