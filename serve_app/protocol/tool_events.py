"""The writer's part for the calls of tools the server runs (`ResponseEventWriter` mixes it
in): each call's item opens, streams its arguments, waits at the model's ``<|call|>``
(pending), runs and closes, its events built by its kind's `ToolItemBuilder`
(tool_items.py) and numbered here. No harmony, no Ray."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from openai.types.responses import (
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseStreamEvent,
)

from serve_app.protocol import responses as builders
from serve_app.protocol.stream_items import ItemKind, ItemStatus, OpenItem
from serve_app.protocol.tool_items import ToolItemBuilder, ToolResult, tool_items


class ToolCallEvents:
    """Server-run calls' events; the state it reads is `ResponseEventWriter`'s."""

    _events: list[ResponseStreamEvent]
    _items: list[ResponseOutputItem]
    _item_indices: list[int]
    _pending_calls: list[OpenItem]
    _tool_calls: int
    _sequence: int
    _next_output_index: int

    if TYPE_CHECKING:  # the writer's part for whole items (whole_item_events.py)

        def _whole_item(self, final: ResponseOutputItem) -> None: ...

    @property
    def tool_calls(self) -> int:
        """How many tool calls the model made (function and custom calls done, server-run
        calls whose arguments are whole, calls no item shows: `count_unshown_call`)."""
        return self._tool_calls

    def count_unshown_call(self) -> None:
        """The model made a call no item shows (its recipient is no tool of the request; the
        server answers it, harmony/items.py): it counts toward ``max_tool_calls`` all the
        same, so a model calling unknown tools is held to that bound as to any."""
        self._tool_calls += 1

    def open_tool_call(self, kind: str, name: str, namespace: str | None = None) -> OpenItem:
        """A call of a tool the server runs (``kind`` has registered items):
        ``output_item.added`` with the kind's in-progress item."""
        item = OpenItem(
            ItemKind.SERVER_TOOL_CALL,
            builders.new_item_id(_id_prefix(kind)),
            self._output_index(),
            name=name,
            call_id=builders.new_call_id(),
            namespace=namespace,
            tool_kind=kind,
        )
        builder = _builder(item)
        self._events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                output_index=item.output_index,
                item=builder.added(item),
                sequence_number=self._seq(),
            )
        )
        # A kind whose item says it is in progress at once (``mcp_call``, as OpenAI streams it).
        opened = getattr(builder, "opened", None)
        if opened is not None:
            self._stamp(opened(item))
        return item

    @property
    def pending_calls(self) -> list[OpenItem]:
        """Server-run calls whose arguments are whole, not run yet, in the model's order."""
        return list(self._pending_calls)

    def take_pending_calls(self) -> list[OpenItem]:
        """The pending calls, now the caller's to close (the tool loop leaves them pending
        while they run, so a response that ends meanwhile closes them: `close_pending_calls`)."""
        calls, self._pending_calls = self._pending_calls, []
        return calls

    def tool_running(self, item: OpenItem) -> None:
        """The call starts running: its kind's running events."""
        self._stamp(_builder(item).running(item))

    def close_tool_call(
        self, item: OpenItem, result: ToolResult | None, status: ItemStatus = "completed"
    ) -> None:
        """The call's last events and ``output_item.done`` with its finished item (``result``
        None: it never ran); no longer pending."""
        self._pending_calls = [call for call in self._pending_calls if call is not item]
        builder = _builder(item)
        events, final = builder.done(item, result, status)
        self._stamp(events)
        self._item_done(item.output_index, final)
        # A kind whose result is an item of its own (the server's `tool_search_output`).
        follow_up = getattr(builder, "follow_up", None)
        if result is not None and follow_up is not None:
            answer = follow_up(item, result)
            if answer is not None:
                self._whole_item(answer)

    def close_pending_calls(self, status: ItemStatus = "incomplete") -> None:
        """The response ends before its pending calls ran: each closed, never run."""
        for item in self.take_pending_calls():
            self.close_tool_call(item, None, status)

    # --- the writer's hooks (`text`, `close`) ----------------------------------------------

    def _tool_delta(self, item: OpenItem, delta: str) -> None:
        self._stamp(_builder(item).argument_delta(item, delta))

    def _tool_arguments_done(self, item: OpenItem, status: ItemStatus) -> None:
        """The model ended the call's message: whole (pending, counted as a call), or cut
        short (closed, never run)."""
        if status != "completed":
            self.close_tool_call(item, None, status)
            return
        self._stamp(_builder(item).arguments_done(item))
        self._pending_calls.append(item)
        self._tool_calls += 1

    def _item_done(self, output_index: int, item: ResponseOutputItem) -> None:
        """``item`` finished: in ``output`` (`_finished`) and its ``output_item.done``."""
        self._finished(output_index, item)
        self._events.append(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                output_index=output_index,
                item=item,
                sequence_number=self._seq(),
            )
        )

    def _finished(self, output_index: int, item: ResponseOutputItem) -> None:
        """``item`` joins ``output`` at its place in the model's order (a call that ran
        finishes after items the model wrote after it)."""
        place = bisect.bisect(self._item_indices, output_index)
        self._item_indices.insert(place, output_index)
        self._items.insert(place, item)

    def _stamp(self, events: Sequence[ResponseStreamEvent]) -> None:
        for event in events:
            self._events.append(event.model_copy(update={"sequence_number": self._seq()}))

    def _output_index(self) -> int:
        index = self._next_output_index
        self._next_output_index += 1
        return index

    def _seq(self) -> int:
        number = self._sequence
        self._sequence += 1
        return number


def _builder(item: OpenItem) -> ToolItemBuilder:
    builder = tool_items(item.tool_kind or "")
    if builder is None:
        raise ValueError(f"no items registered for tool kind {item.tool_kind!r}")
    return builder


def _id_prefix(kind: str) -> str:
    """The item id's prefix: its builder's ``id_prefix`` (``mcp``, ``ws``...), else ``item``."""
    return getattr(tool_items(kind), "id_prefix", None) or "item"
