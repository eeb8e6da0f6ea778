"""Responses stream events, written as an output is produced. No harmony, no Ray.

`ResponseEventWriter` holds what a response's events share: the sequence numbers, the output
indices, the in-progress Response and the items finished so far. Its caller (the harmony
decoder in ``harmony/stream.py``) says what happens: an item opens (`open_message`,
`open_reasoning`, `open_function_call`, `open_custom_tool_call`), its content grows (`text`),
it ends (`close`), the response ends (`finish` or `fail`); the writer turns each into the
events OpenAI sends for it, kept until `take_events`.

Events follow OpenAI's order: ``output_item.added`` -> (``content_part.added`` -> deltas ->
``*.done`` -> ``content_part.done``) or (argument/input deltas -> ``*.done``) ->
``output_item.done`` with the complete item, and exactly one terminal event. A summarized
reasoning item also opens summary part 0 (``reasoning_summary_part.added``) after its content
part, sends each ``reasoning_text.delta`` again as a ``reasoning_summary_text.delta``, and
closes it (``reasoning_summary_text.done``, ``reasoning_summary_part.done``) after its content
part, before ``output_item.done``.

Logprobs of a message's ``output_text`` ride on the ``output_text.delta`` they are given with
(`text`); what no delta carried is given to `close`. The part, ``output_text.done``, the done
item and the final Response hold them all. Every model is built fresh: an event keeps its own
copy of an item, never mutated later. Calls of tools the server runs: `ToolCallEvents`; items
made whole, a server-side compaction's and those the client injects: `WholeItemWriting`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseInProgressEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryPartDoneEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningSummaryTextDoneEvent,
    ResponseReasoningTextDoneEvent,
    ResponseStreamEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
)
from openai.types.responses.response import IncompleteDetails, Moderation
from openai.types.responses.response_content_part_added_event import (
    PartReasoningText as AddedReasoningPart,
)
from openai.types.responses.response_content_part_done_event import (
    PartReasoningText as DoneReasoningPart,
)
from openai.types.responses.response_output_text import Logprob as TextLogprob
from openai.types.responses.response_reasoning_summary_part_added_event import (
    Part as AddedSummaryPart,
)
from openai.types.responses.response_reasoning_summary_part_done_event import (
    Part as DoneSummaryPart,
)

from serve_app.protocol import responses as builders
from serve_app.protocol.client_tool_events import DEFERRED_KINDS, ClientCallWriting
from serve_app.protocol.stream_items import (
    FinishStatus,
    ItemKind,
    ItemStatus,
    OpenItem,
    Phase,
    call_arguments,
    delta_event,
    done_item,
    done_logprob,
    in_progress_item,
    output_text,
    reasoning_item,
    response_error,
    terminal_event,
)
from serve_app.protocol.tool_events import ToolCallEvents
from serve_app.protocol.whole_item_events import WholeItemWriting

logger = logging.getLogger(__name__)


class ResponseEventWriter(ToolCallEvents, ClientCallWriting, WholeItemWriting):
    """Writes one response's stream events: `start`, items opened, grown and closed, then
    exactly one of `finish` or `fail`. Each call keeps its events until `take_events`."""

    def __init__(
        self,
        response: Response,
        *,
        seal_reasoning: Callable[[str], str] | None = None,
        summarize_reasoning: bool = False,
    ) -> None:
        self._template = response
        self._response = response
        self._seal = seal_reasoning
        self._summarize = summarize_reasoning
        self._events: list[ResponseStreamEvent] = []
        self._sequence = 0
        self._started = False
        self._items: list[ResponseOutputItem] = []
        # Each finished item's output index (``_items`` stays in the model's order).
        self._item_indices: list[int] = []
        self._pending_calls: list[OpenItem] = []
        self._next_output_index = 0
        self._tool_calls = 0
        # The request's moderation results (serve_app/serving/moderation.py), set before the
        # terminal event: that event's Response carries them, never an earlier one.
        self.moderation: Moderation | None = None

    @property
    def response(self) -> Response:
        """The in-progress template until a terminal event, then the final Response."""
        return self._response

    @property
    def output_items(self) -> list[ResponseOutputItem]:
        """The items finished so far (``output_item.done`` sent), in output order."""
        return list(self._items)

    @classmethod
    def resumed(
        cls, response: Response, items: Sequence[ResponseOutputItem], next_sequence: int
    ) -> ResponseEventWriter:
        """A writer taking over a stream another writer began and can no longer end (a
        background response whose runner is gone): ``response`` as stored, ``items`` the
        ones it finished, its next event numbered ``next_sequence``. Only `finish` or `fail`
        is left to write."""
        writer = cls(response)
        writer._started = True
        writer._items = list(items)
        writer._item_indices = list(range(len(items)))
        writer._next_output_index = len(items)
        writer._sequence = next_sequence
        return writer

    def take_events(self) -> list[ResponseStreamEvent]:
        """The events written since the last call, in order."""
        events = self._events
        self._events = []
        return events

    def start(self) -> None:
        """``response.created`` then ``response.in_progress``, once."""
        if self._started:
            return
        self._started = True
        self._events += (
            ResponseCreatedEvent(
                type="response.created", response=self._template, sequence_number=self._seq()
            ),
            ResponseInProgressEvent(
                type="response.in_progress",
                response=self._template,
                sequence_number=self._seq(),
            ),
        )

    def answer_at_once(self, usage: ResponseUsage) -> list[ResponseStreamEvent]:
        """A response answered without generating (a WebSocket prewarm): ``response.created``,
        then ``response.completed`` with no output; instead of `start`, once."""
        if self._started:
            return []
        self._started = True
        created = ResponseCreatedEvent(
            type="response.created", response=self._template, sequence_number=self._seq()
        )
        self.finish("completed", usage)
        return [created, *self.take_events()]

    # --- items ---------------------------------------------------------------------------

    def open_message(self, phase: Phase) -> OpenItem:
        """An assistant message: ``final_answer``, or a ``commentary`` preamble."""
        index = self._output_index()
        return self._open(OpenItem(ItemKind.MESSAGE, builders.new_message_id(), index, phase=phase))

    def open_reasoning(self) -> OpenItem:
        index = self._output_index()
        return self._open(OpenItem(ItemKind.REASONING, builders.new_reasoning_id(), index))

    def open_function_call(self, name: str, namespace: str | None = None) -> OpenItem:
        return self._open_call(
            ItemKind.FUNCTION_CALL, builders.new_function_call_id, name, namespace
        )

    def open_custom_tool_call(self, name: str, namespace: str | None = None) -> OpenItem:
        return self._open_call(
            ItemKind.CUSTOM_TOOL_CALL, builders.new_custom_tool_call_id, name, namespace
        )

    def _open_call(
        self, kind: ItemKind, new_item_id: Callable[[], str], name: str, namespace: str | None
    ) -> OpenItem:
        index = self._output_index()
        call = OpenItem(
            kind,
            new_item_id(),
            index,
            name=name,
            call_id=builders.new_call_id(),
            namespace=namespace,
        )
        return self._open(call)

    def text(self, item: OpenItem, delta: str, logprobs: Sequence[TextLogprob] = ()) -> None:
        """The item's content grew by ``delta`` (a message's: with the logprobs of the tokens
        whose text first shows in it)."""
        item.sent.append(delta)
        if item.kind is ItemKind.MESSAGE:
            item.logprobs.extend(logprobs)
        elif item.kind is ItemKind.SERVER_TOOL_CALL:
            self._tool_delta(item, delta)
            return
        elif item.kind in DEFERRED_KINDS:
            return  # a client-run tool's call: announced at `close`
        # The hot path (one delta per engine chunk and open item): `_seq` inlined.
        sequence = self._sequence
        self._events.append(delta_event(item, delta, sequence, logprobs))
        if self._summarize and item.kind is ItemKind.REASONING:
            sequence += 1
            self._events.append(
                ResponseReasoningSummaryTextDeltaEvent(
                    type="response.reasoning_summary_text.delta",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    summary_index=0,
                    delta=delta,
                    sequence_number=sequence,
                )
            )
        self._sequence = sequence + 1

    def close(
        self, item: OpenItem, status: ItemStatus, logprobs: Sequence[TextLogprob] = ()
    ) -> None:
        """The item is done with the content sent so far: its ``*.done`` events and
        ``output_item.done``. ``logprobs``: a message's entries no delta carried."""
        if item.kind is ItemKind.SERVER_TOOL_CALL:
            self._tool_arguments_done(item, status)
            return
        if item.kind in DEFERRED_KINDS and self._close_client_call(item, status):
            return
        events = self._events
        text = item.text
        common: dict[str, Any] = {"item_id": item.item_id, "output_index": item.output_index}
        if item.kind is ItemKind.MESSAGE:
            item.logprobs.extend(logprobs)
            events.append(
                ResponseTextDoneEvent(
                    type="response.output_text.done",
                    content_index=0,
                    text=text,
                    logprobs=[done_logprob(entry) for entry in item.logprobs],
                    sequence_number=self._seq(),
                    **common,
                )
            )
            events.append(self._part_done(output_text(text, item.logprobs), common))
        elif item.kind is ItemKind.REASONING:
            events.append(
                ResponseReasoningTextDoneEvent(
                    type="response.reasoning_text.done",
                    content_index=0,
                    text=text,
                    sequence_number=self._seq(),
                    **common,
                )
            )
            events.append(
                self._part_done(DoneReasoningPart(type="reasoning_text", text=text), common)
            )
            if self._summarized(item):
                events.append(
                    ResponseReasoningSummaryTextDoneEvent(
                        type="response.reasoning_summary_text.done",
                        summary_index=0,
                        text=text,
                        sequence_number=self._seq(),
                        **common,
                    )
                )
                events.append(
                    ResponseReasoningSummaryPartDoneEvent(
                        type="response.reasoning_summary_part.done",
                        summary_index=0,
                        part=DoneSummaryPart(type="summary_text", text=text),
                        sequence_number=self._seq(),
                        **common,
                    )
                )
        elif item.kind is ItemKind.FUNCTION_CALL:
            events.append(
                ResponseFunctionCallArgumentsDoneEvent(
                    type="response.function_call_arguments.done",
                    arguments=call_arguments(text),
                    sequence_number=self._seq(),
                    **common,
                )
            )
        else:
            events.append(
                ResponseCustomToolCallInputDoneEvent(
                    type="response.custom_tool_call_input.done",
                    input=text,
                    sequence_number=self._seq(),
                    **common,
                )
            )
        if item.kind is ItemKind.REASONING:
            final = reasoning_item(
                item.item_id,
                text,
                status,
                summarize=self._summarize,
                encrypted_content=self._sealed(text),
            )
        else:
            final = done_item(item, text, status)
        if item.kind in (ItemKind.FUNCTION_CALL, ItemKind.CUSTOM_TOOL_CALL):
            self._tool_calls += 1
        self._item_done(item.output_index, final)

    # --- the end -------------------------------------------------------------------------

    def finish(
        self,
        status: FinishStatus,
        usage: ResponseUsage | None,
        *,
        incomplete_reason: Literal["max_output_tokens", "content_filter", "steered"] | None = None,
    ) -> None:
        """The final Response (the finished items, ``usage``) and its terminal event:
        ``response.completed`` when ``completed``, else ``response.incomplete`` (a
        ``cancelled`` response too: OpenAI has no ``response.cancelled`` event). ``usage``
        None: the response's own is kept (a resumed writer's)."""
        fields: dict[str, Any] = {"output": list(self._items), "status": status}
        if self.moderation is not None:
            fields["moderation"] = self.moderation
        if usage is not None:
            fields["usage"] = usage
        if incomplete_reason is not None:
            fields["incomplete_details"] = IncompleteDetails(reason=incomplete_reason)
        if status == "completed":
            fields["completed_at"] = int(time.time())
        self._response = self._template.model_copy(update=fields)
        self._events.append(terminal_event(self._response, self._seq()))

    def fail(self, code: str, message: str) -> None:
        """A ``failed`` Response with ``error`` (the finished items kept) and
        ``response.failed``."""
        fields: dict[str, Any] = {
            "status": "failed",
            "error": response_error(code, message),
            "output": list(self._items),
        }
        if self.moderation is not None:
            fields["moderation"] = self.moderation
        self._response = self._template.model_copy(update=fields)
        self._events.append(terminal_event(self._response, self._seq()))

    def fail_ended(self, code: str, message: str) -> ResponseStreamEvent:
        """The response ended (`finish` or `fail`) but cannot stand (it could not be stored):
        now ``failed`` with ``error``, its items and usage kept, and ``response.failed`` to send
        in place of the terminal event already made (the same sequence number)."""
        self._response = self._response.model_copy(
            update={
                "status": "failed",
                "error": response_error(code, message),
                "incomplete_details": None,
                "completed_at": None,
            }
        )
        return terminal_event(self._response, self._sequence - 1)

    def take_sequence(self) -> int:
        """The stream's next sequence number, for an event that joins this response's stream
        without being one of its own (a WebSocket steering event)."""
        return self._seq()

    # --- helpers -------------------------------------------------------------------------

    def _open(self, item: OpenItem) -> OpenItem:
        events = self._events
        events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                output_index=item.output_index,
                item=in_progress_item(item),
                sequence_number=self._seq(),
            )
        )
        if item.kind is ItemKind.MESSAGE:
            part: Any = output_text("")
        elif item.kind is ItemKind.REASONING:
            part = AddedReasoningPart(type="reasoning_text", text="")
        else:
            part = None
        if part is not None:
            events.append(
                ResponseContentPartAddedEvent(
                    type="response.content_part.added",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    content_index=0,
                    part=part,
                    sequence_number=self._seq(),
                )
            )
        if self._summarized(item):
            events.append(
                ResponseReasoningSummaryPartAddedEvent(
                    type="response.reasoning_summary_part.added",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    summary_index=0,
                    part=AddedSummaryPart(type="summary_text", text=""),
                    sequence_number=self._seq(),
                )
            )
        return item

    def _summarized(self, item: OpenItem) -> bool:
        return self._summarize and item.kind is ItemKind.REASONING

    def _part_done(self, part: Any, common: dict[str, Any]) -> ResponseContentPartDoneEvent:
        return ResponseContentPartDoneEvent(
            type="response.content_part.done",
            content_index=0,
            part=part,
            sequence_number=self._seq(),
            **common,
        )

    def _sealed(self, text: str) -> str | None:
        if self._seal is None:
            return None
        try:
            return self._seal(text)
        except Exception:
            logger.exception("response %s: reasoning not sealed", self._template.id)
            return None
