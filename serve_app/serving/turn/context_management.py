"""Server-side compaction: ``context_management: [{"type": "compaction", "compact_threshold": N}]``.

When a turn's rendered prompt reaches N tokens, the server compacts before it generates, with
the machinery of ``POST /v1/responses/compact``: the model is asked for a summary of the
context (`summary_request`), the summary is sealed with the server's key, and the turn answers
from the sealed summary alone. The response carries the ``compaction`` item first, then the
answer: streamed, ``output_item.added`` (empty ``encrypted_content``), one
``response.compaction.compacting`` per batch of summary tokens, ``output_item.done`` with the
sealed summary; non-streamed, ``output[0]``.

The item stands in for everything before it (serve_app.harmony.compaction marks it so), so a
later turn continues either way OpenAI describes: a stateless client appends the output to its
input (and may drop what came before the compaction item: rendering drops it anyway), a
stateful one sends ``previous_response_id`` and only its new input. A prompt under the
threshold costs one comparison with the token count its render already gave.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from openai.types.responses import Response, ResponseStreamEvent

from serve_app.config import AppArgs
from serve_app.engines.base import SERVER_ERROR
from serve_app.harmony import compaction
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.errors import APIError, ServerError
from serve_app.protocol.requests import CompactionItem, InputItem, MessageItem, ResponsesRequest
from serve_app.serving import metrics
from serve_app.serving.admission import responses as rules
from serve_app.serving.turn.state import Ask, Turn

logger = logging.getLogger(__name__)

# Without ``compact_threshold``: compact once the prompt fills this share of the context.
DEFAULT_THRESHOLD_SHARE = 0.8


def threshold(args: AppArgs, request: ResponsesRequest) -> int | None:
    """The prompt size (tokens) at which ``request`` compacts, or None if it never does."""
    for entry in request.context_management or ():
        if entry.type == "compaction":
            if entry.compact_threshold is not None:
                return entry.compact_threshold
            return int(args.max_context_tokens * DEFAULT_THRESHOLD_SHARE)
    return None


def due(args: AppArgs, request: ResponsesRequest, prompt_tokens: int) -> bool:
    """Whether a prompt of ``prompt_tokens`` tokens is compacted before the answer."""
    limit = threshold(args, request)
    return limit is not None and prompt_tokens >= limit


def summary_request(request: ResponsesRequest, items: list[InputItem]) -> ResponsesRequest:
    """The turn that asks the model to summarize ``items`` (the history and the request's
    input, references resolved): the request's model, instructions and tools, no tool call,
    nothing stored, no output limit (as at OpenAI: a cut summary is no summary)."""
    return request.model_copy(
        update={
            "input": [*items, MessageItem(role="user", content=compaction.SUMMARY_REQUEST)],
            "previous_response_id": None,
            "conversation": None,
            "tool_choice": "none",
            "store": False,
            "stream": False,
            "background": False,
            "include": [],
            "max_output_tokens": None,
            "context_management": None,
        }
    )


def summary_of(response: Response) -> str:
    """The summary a summary turn wrote; an `APIError` if it wrote none."""
    if response.status == "failed" and response.error is not None:
        raise rules.failed_response_error(response.error.message, response.error.code)
    summary = response.output_text.strip()
    if not summary and response.status == "incomplete":
        raise rules.no_room_for_summary()
    if not summary:
        raise ServerError("The model wrote no summary.", code=SERVER_ERROR)
    return summary


def kept_message(stored: dict[str, Any]) -> dict[str, Any]:
    """A user message ``/v1/responses/compact`` keeps, as an output item (the Open Responses
    ``Message``: id, ``status``, content parts; an image part with its ``detail``)."""
    content = [
        {"detail": "auto", "image_url": None, **part} if part.get("type") == "input_image" else part
        for part in stored["content"]
    ]
    return {**stored, "status": "completed", "content": content}


class _Service(Protocol):
    """What `compact_first` needs of `ResponsesService` (typed here: the service imports this
    module)."""

    @property
    def vault(self) -> ReasoningVault: ...

    async def prepare(self, ask: Ask) -> Turn: ...

    def event_batches(self, turn: Turn) -> AsyncIterator[list[ResponseStreamEvent]]: ...

    async def retarget(self, turn: Turn, request: ResponsesRequest) -> None: ...


async def compact_first(service: _Service, turn: Turn) -> AsyncIterator[list[ResponseStreamEvent]]:
    """The compaction of a turn whose prompt reached its threshold, as event batches (after
    ``response.created``); then ``turn.generate`` asks for the answer from the summary alone.
    A summary that cannot be written raises its `APIError` (the turn ends failed); one the
    engines refuse before it starts, `RateLimited` before any event (the turn is refused)."""
    writer = turn.translator.writer
    items = [*turn.history, *turn.request.input_items]
    ask = await service.prepare(
        Ask(summary_request(turn.request, items), turn.owner, check_limits=False)
    )
    async with contextlib.aclosing(service.event_batches(ask)) as batches:
        # The summary's first batch comes once an engine has taken it: the item opens then.
        first = await anext(batches)
        item = writer.open_compaction()
        if _writes(first):
            writer.compacting(item)
        yield writer.take_events()
        async for batch in batches:
            if _writes(batch):
                writer.compacting(item)
                yield writer.take_events()
    summary = summary_of(ask.response)
    metrics.COMPACTIONS.inc()
    sealed = compaction.seal_summary(service.vault, summary, turn.owner, replaces_all=True)
    writer.close_compaction(item, sealed)
    yield writer.take_events()
    logger.info(
        "response %s: compacted before answering (%d prompt tokens, summary %d tokens)",
        turn.response.id,
        len(turn.generate.prompt_token_ids),
        ask.response.usage.output_tokens if ask.response.usage else 0,
        extra={"response_id": turn.response.id},
    )
    # Rendering drops what the compaction item stands in for: the answer sees the summary.
    compacted = CompactionItem(type="compaction", id=item.item_id, encrypted_content=sealed)
    answer = turn.request.model_copy(update={"input": [*turn.request.input_items, compacted]})
    try:
        await service.retarget(turn, answer)
    except APIError:
        raise
    except Exception as error:  # a bug of ours: this turn fails, logged, no other
        logger.exception("response %s: not rendered after compaction", turn.response.id)
        raise ServerError("The compacted context could not be rendered.") from error


def _writes(batch: list[ResponseStreamEvent]) -> bool:
    """Whether the summary's batch writes its text."""
    return any(event.type == "response.output_text.delta" for event in batch)
