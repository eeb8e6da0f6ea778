"""The turn's event loop: the engine's chunks through the stream translator into events, from
``response.created`` to exactly one terminal event, the turn stored before that event."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator

from openai.types.responses import Response, ResponseStreamEvent

from serve_app.engines.base import SERVER_ERROR, GenerateChunk
from serve_app.protocol.errors import RATE_LIMITED, APIError, RateLimited
from serve_app.routing import metrics as routing_metrics
from serve_app.serving import metrics
from serve_app.serving.engine.client import EngineClient
from serve_app.serving.turn.persistence import NOT_STORED_MESSAGE, NotStored, Persistence
from serve_app.serving.turn.state import Turn

logger = logging.getLogger(__name__)


class EventLoop:
    def __init__(self, engine: EngineClient, persistence: Persistence) -> None:
        self._engine = engine
        self._persistence = persistence

    async def events(self, turn: Turn) -> AsyncIterator[ResponseStreamEvent]:
        """The turn's events, from ``response.created`` to exactly one terminal event."""
        async with contextlib.aclosing(self.event_batches(turn)) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    async def run(self, turn: Turn) -> Response:
        """The non-streaming form: the same Response the stream's terminal event carries."""
        async for _ in self.events(turn):
            pass
        return turn.response

    async def event_batches(self, turn: Turn) -> AsyncIterator[list[ResponseStreamEvent]]:
        """``events``, as one non-empty list per engine chunk: what a transport sends in one
        write (one ASGI message costs the same whether it carries one event or ten).

        The first batch (``response.created``) comes once an engine has taken the request, as
        OpenAI's: the engines at capacity before that raise `RateLimited` (the client's 429,
        nothing stored), unless the response was announced already (``turn.announced``)."""
        translator = turn.translator
        opening = translator.start()  # sent when the engine has taken the request
        terminal: list[ResponseStreamEvent] = []
        prompt_tokens = cached_tokens = 0
        first_token_seen = False
        replica = None
        try:
            if turn.before_answer is not None:
                async with contextlib.aclosing(turn.before_answer(turn)) as before:
                    async for batch in before:
                        yield [*opening, *batch]
                        opening = []
            # Closed on leaving (a steered end breaks out early): that aborts the engine request.
            async with contextlib.aclosing(self._engine_chunks(turn)) as chunks:
                async for chunk in chunks:
                    if opening:
                        yield opening
                        opening = []
                    replica = replica or chunk.replica
                    prompt_tokens = chunk.num_prompt_tokens or prompt_tokens
                    cached_tokens = max(cached_tokens, chunk.num_cached_tokens)
                    if chunk.token_ids and not first_token_seen:
                        first_token_seen = True
                        turn.first_token_at = time.monotonic()
                        metrics.TIME_TO_FIRST_TOKEN.observe(turn.first_token_at - turn.arrived_at)
                    if turn.end_at_boundary is not None and turn.end_at_boundary():
                        fed, read = translator.feed_to_boundary(chunk.token_ids, chunk.logprobs)
                        if fed:
                            yield fed
                        # At a boundary with the completion not over: end here. (Its last token
                        # read and the engine done: it ended on its own, as below.)
                        over = read == len(chunk.token_ids) and chunk.finish_reason is not None
                        if translator.at_safe_boundary and not over:
                            terminal = translator.finish(
                                "steered", prompt_tokens=prompt_tokens, cached_tokens=cached_tokens
                            )
                            break
                    elif fed := translator.feed(chunk.token_ids, chunk.logprobs):
                        yield fed
                    if chunk.finish_reason == "error":
                        # The engine's code says whose fault it was (invalid_prompt: the client's).
                        code = chunk.error_code or SERVER_ERROR
                        terminal = translator.fail(chunk.error or "The engine failed.", code)
                    elif chunk.finish_reason is not None:
                        terminal = translator.finish(
                            chunk.finish_reason,
                            prompt_tokens=prompt_tokens,
                            cached_tokens=cached_tokens,
                        )
                    if terminal:
                        break
            if not terminal:
                terminal = translator.fail("The engine stream ended early.", "server_error")
        except RateLimited as busy:
            # Every engine replica is full and the queue too (the engine client's word for
            # it). Before the first event: the request is refused (HTTP 429 with Retry-After,
            # a WebSocket error event), as OpenAI refuses it. After: the stream ends with this
            # code, which Codex retries after the delay the message names.
            logger.warning("response %s: engines at capacity", turn.response.id)
            if opening and not turn.announced:
                raise
            terminal = translator.fail(busy.message, RATE_LIMITED)
        except APIError as error:  # what runs before the answer could not be done
            terminal = translator.fail(error.message, error.code or SERVER_ERROR)
        except Exception as exc:  # a replica died or the handle failed: never hang the client
            logger.exception("response %s: engine call failed", turn.response.id)
            terminal = translator.fail(f"The engine failed: {type(exc).__name__}", "server_error")
        try:
            # Stored before the terminal event, so a client chaining right after it finds it,
            # and so no client is told of a response that is not stored.
            await self._persistence.keep(turn)
        except NotStored:
            failed = turn.translator.fail_ended(NOT_STORED_MESSAGE, SERVER_ERROR)
            if turn.request.background:
                raise  # its runner ends the run failed, in the store (BackgroundRunner)
            terminal[-1:] = [failed]
        finally:
            routing_metrics.record_prompt(replica, prompt_tokens, cached_tokens)
            _record(turn)
        if terminal:
            yield [*opening, *terminal]

    async def _engine_chunks(self, turn: Turn) -> AsyncIterator[GenerateChunk]:
        """The engine's chunks, until the translator has made the ``max_tool_calls`` calls
        allowed: then a ``stop`` in place of the rest, and the engine request is aborted."""
        async with contextlib.aclosing(self._engine.stream(turn.generate)) as chunks:
            async for chunk in chunks:
                yield chunk
                if chunk.finish_reason is not None:
                    return
                if turn.translator.tool_calls_exhausted:
                    # Closing the engine stream unfinished cancels the engine request.
                    yield GenerateChunk(finish_reason="stop")
                    return


def _record(turn: Turn) -> None:
    response = turn.response
    metrics.REQUESTS.labels(response.status or "unknown").inc()
    metrics.E2E_LATENCY.observe(time.monotonic() - turn.arrived_at)
    usage = response.usage
    if usage is not None:
        metrics.PROMPT_TOKENS.inc(usage.input_tokens)
        metrics.CACHED_PROMPT_TOKENS.inc(usage.input_tokens_details.cached_tokens)
        metrics.GENERATION_TOKENS.inc(usage.output_tokens)
        if turn.first_token_at is not None and usage.output_tokens > 1:
            decode_s = time.monotonic() - turn.first_token_at
            metrics.TIME_PER_OUTPUT_TOKEN.observe(decode_s / (usage.output_tokens - 1))
    logger.info(
        "response %s: %s, usage %s",
        response.id,
        response.status,
        usage,
        extra={"response_id": response.id, "status": response.status},
    )
