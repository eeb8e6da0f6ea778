"""The pieces of a Responses stream that `ResponseEventWriter` (stream_events.py) assembles:
an open item (`OpenItem`), each single event (`delta_event`, `terminal_event`) and item
(`in_progress_item`, `done_item`, `reasoning_item`) as OpenAI sends them. No harmony, no Ray.

Every model is built fresh: an event keeps its own copy of an item, never mutated later.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseCompactionItem,
    ResponseCompletedEvent,
    ResponseCustomToolCall,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)
from openai.types.responses.response_error import ResponseError
from openai.types.responses.response_output_text import Logprob as TextLogprob
from openai.types.responses.response_reasoning_item import Content as ReasoningContent
from openai.types.responses.response_reasoning_item import Summary as ReasoningSummary
from openai.types.responses.response_text_delta_event import Logprob as DeltaLogprob
from openai.types.responses.response_text_delta_event import (
    LogprobTopLogprob as DeltaTopLogprob,
)
from openai.types.responses.response_text_done_event import Logprob as DoneLogprob
from openai.types.responses.response_text_done_event import LogprobTopLogprob as DoneTopLogprob
from pydantic import ValidationError

ItemStatus = Literal["completed", "incomplete"]
Phase = Literal["commentary", "final_answer"]
# How a response ends: `finish`'s status (`fail` is the other way).
FinishStatus = Literal["completed", "incomplete", "cancelled"]


# The key of `OpenItem.data` holding a server-run call's harmony channel.
CALL_CHANNEL = "channel"


class ItemKind(enum.Enum):
    REASONING = "reasoning"
    MESSAGE = "message"
    FUNCTION_CALL = "function_call"
    CUSTOM_TOOL_CALL = "custom_tool_call"
    COMPACTION = "compaction"
    # A call of a tool the server runs: its item and events are its kind's
    # (`OpenItem.tool_kind`, built by that kind's `tool_items.ToolItemBuilder`).
    SERVER_TOOL_CALL = "server_tool_call"
    # Calls to client-run tools (protocol/client_tool_events.py builds their items and events).
    SHELL_CALL = "shell_call"
    LOCAL_SHELL_CALL = "local_shell_call"
    APPLY_PATCH_CALL = "apply_patch_call"


@dataclass
class OpenItem:
    """An output item being streamed (``output_item.added`` sent, ``output_item.done`` not)."""

    kind: ItemKind
    item_id: str
    output_index: int
    phase: Phase | None = None
    name: str = ""
    call_id: str = ""
    namespace: str | None = None
    # Content sent in deltas so far (`text`), in pieces: appending to one string copied all
    # of it again with every delta, a cost growing with the item's length.
    sent: list[str] = field(default_factory=list)
    # Logprobs of the output_text sent so far (messages only).
    logprobs: list[TextLogprob] = field(default_factory=list)
    # A server-run call's tool kind (``ToolSpec.kind``), and what its builder keeps between
    # events (the kind's own, e.g. a parsed action).
    tool_kind: str | None = None
    # (`data[CALL_CHANNEL]`: the harmony channel the model called it on; its output goes
    # back on the same one.)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The content sent in deltas so far (its pieces joined once, when read)."""
        sent = self.sent
        if len(sent) > 1:
            sent[:] = ["".join(sent)]
        return sent[0] if sent else ""


# --- single events and items -----------------------------------------------------------------


def delta_event(
    item: OpenItem, delta: str, sequence_number: int, logprobs: Sequence[TextLogprob] = ()
) -> ResponseStreamEvent:
    """The item's content delta: ``output_text`` (with ``logprobs``), ``reasoning_text``,
    function call arguments or custom tool call input."""
    common: dict[str, Any] = {
        "item_id": item.item_id,
        "output_index": item.output_index,
        "delta": delta,
        "sequence_number": sequence_number,
    }
    if item.kind is ItemKind.MESSAGE:
        return ResponseTextDeltaEvent(
            type="response.output_text.delta",
            content_index=0,
            logprobs=[delta_logprob(entry) for entry in logprobs],
            **common,
        )
    if item.kind is ItemKind.REASONING:
        return ResponseReasoningTextDeltaEvent(
            type="response.reasoning_text.delta", content_index=0, **common
        )
    if item.kind is ItemKind.FUNCTION_CALL:
        return ResponseFunctionCallArgumentsDeltaEvent(
            type="response.function_call_arguments.delta", **common
        )
    return ResponseCustomToolCallInputDeltaEvent(
        type="response.custom_tool_call_input.delta", **common
    )


def terminal_event(response: Response, sequence_number: int) -> ResponseStreamEvent:
    """The event that ends a stream with ``response``: completed, failed, else incomplete."""
    if response.status == "completed":
        return ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=sequence_number
        )
    if response.status == "failed":
        return ResponseFailedEvent(
            type="response.failed", response=response, sequence_number=sequence_number
        )
    return ResponseIncompleteEvent(
        type="response.incomplete", response=response, sequence_number=sequence_number
    )


def compaction_item(item: OpenItem, encrypted_content: str) -> ResponseCompactionItem:
    return ResponseCompactionItem(
        id=item.item_id, type="compaction", encrypted_content=encrypted_content
    )


def in_progress_item(item: OpenItem) -> ResponseOutputItem:
    """The item as ``output_item.added`` announces it: no content yet, ``in_progress``."""
    if item.kind is ItemKind.REASONING:
        return ResponseReasoningItem(id=item.item_id, type="reasoning", summary=[], content=[])
    return _item(item, "", "in_progress", done=False)


def done_item(item: OpenItem, text: str, status: str) -> ResponseOutputItem:
    """A finished message or tool call (reasoning: `reasoning_item`)."""
    return _item(item, text, status, done=True)


def _item(item: OpenItem, text: str, status: str, *, done: bool) -> ResponseOutputItem:
    if item.kind is ItemKind.MESSAGE:
        return ResponseOutputMessage(
            id=item.item_id,
            type="message",
            role="assistant",
            status=status,
            content=[output_text(text, item.logprobs)] if done else [],
            phase=item.phase,
        )
    extra: dict[str, Any] = {"namespace": item.namespace} if item.namespace else {}
    if item.kind is ItemKind.FUNCTION_CALL:
        return ResponseFunctionToolCall(
            id=item.item_id,
            type="function_call",
            call_id=item.call_id,
            name=item.name,
            arguments=call_arguments(text) if done else "",
            status=status,
            **extra,
        )
    if item.kind is ItemKind.CUSTOM_TOOL_CALL:
        # The SDK's custom_tool_call has no `status`; Codex accepts it and it marks a call cut
        # short, so it is sent like the other items' (kept as an extra field).
        return ResponseCustomToolCall(
            id=item.item_id,
            type="custom_tool_call",
            call_id=item.call_id,
            name=item.name,
            input=text if done else "",
            status=status,
            **extra,
        )
    raise ValueError(f"not a message or tool call: {item.kind}")


def reasoning_item(
    item_id: str,
    text: str,
    status: str,
    *,
    summarize: bool,
    encrypted_content: str | None = None,
) -> ResponseReasoningItem:
    """A finished reasoning item: ``text`` as its content (and summary, with ``summarize``)."""
    summary = [ReasoningSummary(type="summary_text", text=text)] if summarize else []
    fields: dict[str, Any] = {
        "id": item_id,
        "type": "reasoning",
        "summary": summary,
        "content": [ReasoningContent(type="reasoning_text", text=text)],
    }
    if encrypted_content is not None:
        # Only when sealed: the specification does not let `encrypted_content` be null.
        fields["encrypted_content"] = encrypted_content
    if status == "incomplete":
        # Reasoning items carry no status when complete (as OpenAI sends them).
        fields["status"] = "incomplete"
    return ResponseReasoningItem(**fields)


def output_text(text: str, logprobs: Sequence[TextLogprob] = ()) -> ResponseOutputText:
    return ResponseOutputText(
        type="output_text", text=text, annotations=[], logprobs=list(logprobs)
    )


def call_arguments(text: str) -> str:
    # A call without arguments (`to=functions.list<|call|>`, or `<|message|>` straight to
    # `<|call|>`) is sent as "{}": clients parse arguments as JSON, and "" is not JSON.
    return text if text.strip() else "{}"


def delta_logprob(entry: TextLogprob) -> DeltaLogprob:
    top = [DeltaTopLogprob(token=alt.token, logprob=alt.logprob) for alt in entry.top_logprobs]
    return DeltaLogprob(token=entry.token, logprob=entry.logprob, top_logprobs=top)


def done_logprob(entry: TextLogprob) -> DoneLogprob:
    top = [DoneTopLogprob(token=alt.token, logprob=alt.logprob) for alt in entry.top_logprobs]
    return DoneLogprob(token=entry.token, logprob=entry.logprob, top_logprobs=top)


def response_error(code: str, message: str) -> ResponseError:
    try:
        return ResponseError(code=code, message=message)  # type: ignore[arg-type]
    except ValidationError:
        # The SDK's Literal lacks codes clients act on (`context_length_exceeded` and
        # `insufficient_quota` are fatal for Codex, others are retried): send the code as given.
        return ResponseError.model_construct(code=code, message=message)
