"""The turn's event loop: the engine's chunks through the stream translator into events, from
``response.created`` to exactly one terminal event, the turn stored before that event."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from openai.types.responses import Response, ResponseStreamEvent

from serve_app.engines.base import SERVER_ERROR, GenerateChunk, GenerateRequest
from serve_app.harmony.render import tool_output_tokens
from serve_app.protocol.client_tools import OWED_CALL_TYPES
from serve_app.protocol.errors import RATE_LIMITED, APIError, RateLimited
from serve_app.routing import metrics as routing_metrics
from serve_app.serving import metrics
from serve_app.serving.engine.client import EngineClient
from serve_app.serving.tools.contract import CancelScope
from serve_app.serving.tools.loop import Round, ToolLoop, after_last_call, client_calls
from serve_app.serving.turn.client_outputs import Committed, owed_calls
from serve_app.serving.turn.history import INPUT_ITEMS
from serve_app.serving.turn.persistence import NOT_STORED_MESSAGE, NotStored, Persistence
from serve_app.serving.turn.state import Turn

logger = logging.getLogger(__name__)


@dataclass
class _Completion:
    """One completion of the model, as it went (`EventLoop._completion`)."""

    replica: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # Its token ids (kept when the service has the tool loop: a continuation's prompt).
    token_ids: list[int] = field(default_factory=list)
    # Calls of tools the client runs among the response's items before it.
    client_calls: int = 0
    # How it ended: the response's terminal events, or calls of server-run tools pending.
    terminal: list[ResponseStreamEvent] = field(default_factory=list)
    tools_pending: bool = False
    # It ended with calls of tools the client runs, whose outputs the response waits for.
    awaits_client: bool = False


class EventLoop:
    def __init__(
        self, engine: EngineClient, persistence: Persistence, tools: ToolLoop | None = None
    ) -> None:
        self._engine = engine
        self._persistence = persistence
        # The tool loop, when the service runs tools (else a pending call ends the response).
        self._tools = tools

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
        """`_event_batches`; a moderated turn's input is judged from now on, beside the engine
        request it makes at once (serve_app/serving/moderation.py), and no judgement outlives
        the turn."""
        moderation = turn.moderation
        if moderation is None:
            async with contextlib.aclosing(self._event_batches(turn)) as batches:
                async for batch in batches:
                    yield batch
            return
        moderation.begin()
        try:
            async with contextlib.aclosing(self._event_batches(turn)) as batches:
                async for batch in batches:
                    yield batch
        finally:
            moderation.cancel()

    async def _event_batches(self, turn: Turn) -> AsyncIterator[list[ResponseStreamEvent]]:
        """``events``, as one non-empty list per engine chunk: what a transport sends in one
        write (one ASGI message costs the same whether it carries one event or ten).

        The first batch (``response.created``) comes once an engine has taken the request, as
        OpenAI's: the engines at capacity before that raise `RateLimited` (the client's 429,
        nothing stored), unless the response was announced already (``turn.announced``).
        A completion that leaves calls of tools the server runs pending, or calls of tools the
        request does not have unanswered, goes on through the tool loop
        (serve_app/serving/tools/loop.py): the calls run (or are answered), the next completion
        streams on, until the response ends."""
        try:
            async with contextlib.aclosing(self._batches(turn)) as batches:
                async for batch in batches:
                    yield batch
        finally:
            if turn.tool_sessions and self._tools is not None:
                await self._tools.close_sessions(turn)

    async def _batches(self, turn: Turn) -> AsyncIterator[list[ResponseStreamEvent]]:
        translator = turn.translator
        opening = translator.start()  # sent when the engine has taken the request
        terminal: list[ResponseStreamEvent] = []
        completion = _Completion()
        try:
            if turn.tools_first is not None:
                # Nothing of it runs for a response the server refuses: an engine takes the
                # response and it is stored (as in progress) before its first event.
                await self._admit(turn)
                if turn.request.store:
                    await self._persistence.save(turn)
                yield opening
                opening = []
                async with contextlib.aclosing(turn.tools_first(turn)) as batches:
                    async for batch in batches:
                        yield batch
            if turn.before_answer is not None:
                async with contextlib.aclosing(turn.before_answer(turn)) as before:
                    async for batch in before:
                        yield [*opening, *batch]
                        opening = []
            while True:
                completion = _Completion(replica=completion.replica)
                async with contextlib.aclosing(self._completion(turn, completion)) as batches:
                    async for batch in batches:
                        if opening or batch:  # the engine took the request: say so at once
                            yield [*opening, *batch]
                            opening = []
                terminal = completion.terminal
                if completion.awaits_client:
                    # The client's outputs, injected while the response waits, continue it.
                    resumed, placed = await self._client_outputs(turn, completion)
                    if placed:
                        yield placed
                    if isinstance(resumed, str):
                        terminal = await self._end_between(turn, resumed)
                        break
                    turn.generate = resumed
                    translator.begin_completion()
                    continue
                if terminal or not completion.tools_pending or self._tools is None:
                    break
                # The completion's pending calls run; the response goes on, or ends here.
                done = Round(
                    client_called=client_calls(turn) > completion.client_calls,
                    context_tokens=len(turn.generate.prompt_token_ids) + len(completion.token_ids),
                )
                calls = translator.writer.pending_calls  # pending until each is closed
                if calls:  # else only calls of tools the request does not have: no events
                    scope = CancelScope()
                    async with contextlib.aclosing(
                        self._tools.run_calls(turn, calls, scope, done)
                    ) as batches:
                        async for batch in batches:
                            yield batch
                self._tools.answer_unknown(turn, translator.unknown_calls.take(), done)
                following = self._tools.next_completion(turn, completion.token_ids, done)
                steer = turn.end_at_boundary
                if not isinstance(following, str) and steer is not None and steer():
                    following = "steered"  # between two completions: a safe boundary
                if isinstance(following, str):
                    terminal = await self._end_between(turn, following)
                    break
                turn.generate = following
                translator.begin_completion()
            if not terminal:
                await self._settle(turn, wait=False)
                terminal = translator.fail("The engine stream ended early.", "server_error")
        except RateLimited as busy:
            # Every engine replica is full and the queue too (the engine client's word for
            # it). Before the first event: the request is refused (HTTP 429 with Retry-After,
            # a WebSocket error event), as OpenAI refuses it. After: the stream ends with this
            # code, which Codex retries after the delay the message names.
            logger.warning("response %s: engines at capacity", turn.response.id)
            if opening and not turn.announced:
                raise
            await self._settle(turn, wait=False)
            terminal = translator.fail(busy.message, RATE_LIMITED)
        except APIError as error:  # what runs before the answer could not be done
            if opening and not turn.announced:
                raise  # before the first event (the response not stored): the client's error
            await self._settle(turn, wait=False)
            terminal = translator.fail(error.message, error.code or SERVER_ERROR)
        except Exception as exc:  # a replica died or the handle failed: never hang the client
            logger.exception("response %s: engine call failed", turn.response.id)
            await self._settle(turn, wait=False)
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
            _record(turn)
        if terminal:
            yield [*opening, *terminal]

    async def _admit(self, turn: Turn) -> None:
        """Wait until an engine takes the turn's prompt as it stands (the engines at capacity:
        `RateLimited`), then let it go: the admission of a response whose server-run tools
        must not run unless it is served. One token asked for, none read: closing the stream
        at its first chunk (an engine has the request) aborts it."""
        generate = turn.generate
        sampling = dataclasses.replace(generate.sampling, max_tokens=1, logprobs=None)
        probe = dataclasses.replace(
            generate,
            request_id=f"{generate.request_id}-admit",
            sampling=sampling,
            constraint=None,
        )
        async with contextlib.aclosing(self._engine.stream(probe)) as chunks:
            async for _ in chunks:
                return

    async def _completion(
        self, turn: Turn, completion: _Completion
    ) -> AsyncIterator[list[ResponseStreamEvent]]:
        """One completion of the model through the translator: its event batches, one per
        engine chunk (empty when the chunk made none); ``completion`` says how it ended (a
        terminal event, or calls pending)."""
        translator = turn.translator
        turn.completions += 1
        completion.client_calls = client_calls(turn)
        # A continuation's prompt holds the completion's tokens: kept whenever the loop may
        # continue, which any request's may (a call of a tool the request does not have is
        # answered by the loop, whatever tools the request has).
        keep_tokens = self._tools is not None
        try:
            # Closed on leaving (a steered end breaks out early): that aborts the engine request.
            async with contextlib.aclosing(self._engine_chunks(turn)) as chunks:
                async for chunk in chunks:
                    completion.replica = completion.replica or chunk.replica
                    completion.prompt_tokens = chunk.num_prompt_tokens or completion.prompt_tokens
                    completion.cached_tokens = max(
                        completion.cached_tokens, chunk.num_cached_tokens
                    )
                    turn.output_tokens += len(chunk.token_ids)
                    if keep_tokens:
                        completion.token_ids.extend(chunk.token_ids)
                    if chunk.token_ids and turn.first_token_at is None:
                        turn.first_token_at = time.monotonic()
                        ttft_s = turn.first_token_at - turn.arrived_at
                        metrics.TIME_TO_FIRST_TOKEN.observe(ttft_s)
                        metrics.TIER_TIME_TO_FIRST_TOKEN.labels(turn.tier).observe(ttft_s)
                    if turn.end_at_boundary is not None and turn.end_at_boundary():
                        fed, read = translator.feed_to_boundary(chunk.token_ids, chunk.logprobs)
                        _observe(turn, fed)
                        yield fed
                        # At a boundary with the completion not over: end here. (Its last token
                        # read and the engine done: it ended on its own, as below.)
                        over = read == len(chunk.token_ids) and chunk.finish_reason is not None
                        if translator.at_safe_boundary and not over:
                            completion.terminal = await self._end(turn, completion, "steered")
                            return
                    else:
                        fed = translator.feed(chunk.token_ids, chunk.logprobs)
                        _observe(turn, fed)
                        yield fed
                    if turn.moderation is not None and turn.moderation.output_blocked:
                        # A flagged output window under `block`: no more output.
                        completion.terminal = await self._end(turn, completion, "content_filter")
                        return
                    if chunk.finish_reason == "error":
                        # The engine's code says whose fault it was (invalid_prompt: the client's).
                        code = chunk.error_code or SERVER_ERROR
                        await self._settle(turn, wait=False)
                        completion.terminal = translator.fail(
                            chunk.error or "The engine failed.", code
                        )
                        return
                    if chunk.finish_reason is not None:
                        if chunk.finish_reason == "stop" and self._runs_pending(turn):
                            completion.tools_pending = True
                        elif chunk.finish_reason == "stop" and self._awaits_client(turn):
                            completion.awaits_client = True
                        else:
                            completion.terminal = await self._end(
                                turn, completion, chunk.finish_reason
                            )
                        return
        finally:
            turn.prompt_tokens += completion.prompt_tokens
            turn.cached_tokens += completion.cached_tokens
            routing_metrics.record_prompt(
                completion.replica, completion.prompt_tokens, completion.cached_tokens
            )

    def _runs_pending(self, turn: Turn) -> bool:
        """Calls of server-run tools are pending, or calls of tools the request does not have
        await their answer, and this service has the tool loop (without it, the response ends:
        the calls close unrun, the unknown ones unanswered)."""
        translator = turn.translator
        return self._tools is not None and bool(
            translator.writer.pending_calls or translator.unknown_calls.calls
        )

    def _awaits_client(self, turn: Turn) -> bool:
        """The response may wait for the client's outputs (`Turn.client_outputs`), and owes
        some (without the tool loop it cannot go on, and ends as without the wait)."""
        return (
            self._tools is not None
            and turn.client_outputs is not None
            and bool(owed_calls(turn.translator.output_items))
        )

    async def _client_outputs(
        self, turn: Turn, completion: _Completion
    ) -> tuple[GenerateRequest | str, list[ResponseStreamEvent]]:
        """The wait for the client's outputs after ``completion``: the engine request that
        continues the response once every call has its output (else how it ends: ``stop``,
        completed with the calls still owed, as without the wait; ``length``), and the events
        placing the outputs committed meanwhile in the response."""
        box, tools, translator = turn.client_outputs, self._tools, turn.translator
        if box is None or tools is None:  # `_awaits_client` said yes: not reached
            return "stop", []
        committed = await box.collect(translator.output_items)
        if not committed:
            return "stop", []
        translator.writer.place([item for batch in committed for item in batch.items])
        placed = translator.writer.take_events()
        cut = after_last_call(completion.token_ids)
        if owed_calls(translator.output_items) or cut is None:
            return "stop", placed
        messages = self._output_messages(turn, committed)
        return tools.continue_with(turn, completion.token_ids[:cut], messages), placed

    @staticmethod
    def _output_messages(turn: Turn, committed: list[Committed]) -> list[int]:
        """The committed outputs as the tools' harmony messages, in commit order."""
        calls = INPUT_ITEMS.validate_python(
            [
                item.model_dump(mode="json", exclude_none=True)
                for item in turn.translator.output_items
                if item.type in OWED_CALL_TYPES
            ]
        )
        outputs = [output for batch in committed for output in batch.inputs]
        return tool_output_tokens(outputs, calls, turn.tools)

    async def _end(
        self, turn: Turn, completion: _Completion, reason: str
    ) -> list[ResponseStreamEvent]:
        """`_finish`, with the turn's moderation settled first: a flagged `block` side makes
        it ``content_filter`` (a cancelled response stays cancelled, judged no further)."""
        # Blocked or cancelled: no judgement still running is waited for.
        wait = reason not in ("abort", "content_filter")
        if await self._settle(turn, wait=wait) and reason != "abort":
            reason = "content_filter"
        return self._finish(turn, completion, reason)

    async def _end_between(self, turn: Turn, reason: str) -> list[ResponseStreamEvent]:
        """The terminal event between two completions (the turn's usage summed already), the
        turn's moderation settled first: a flagged `block` side makes it ``content_filter``."""
        if await self._settle(turn, wait=True):
            reason = "content_filter"
        return turn.translator.finish(
            reason, prompt_tokens=turn.prompt_tokens, cached_tokens=turn.cached_tokens
        )

    @staticmethod
    async def _settle(turn: Turn, *, wait: bool) -> bool:
        """The turn's moderation results onto the Response its terminal event carries (made
        next); whether a `block` side was flagged. ``wait`` false: a failed or cancelled
        response does not wait for judgements still running (error results)."""
        moderation = turn.moderation
        if moderation is None:
            return False
        turn.translator.writer.moderation = await moderation.settle(wait=wait)
        return moderation.blocked

    @staticmethod
    def _finish(turn: Turn, completion: _Completion, reason: str) -> list[ResponseStreamEvent]:
        """The terminal event for ``reason``, usage summed over the response's completions."""
        return turn.translator.finish(
            reason,
            prompt_tokens=turn.prompt_tokens + completion.prompt_tokens,
            cached_tokens=turn.cached_tokens + completion.cached_tokens,
        )

    async def _engine_chunks(self, turn: Turn) -> AsyncIterator[GenerateChunk]:
        """The engine's chunks, until the translator has made the ``max_tool_calls`` calls
        allowed: then a ``stop`` in place of the rest, and the engine request is aborted."""
        stream = self._engine.stream(turn.generate)
        if turn.moderation is not None:  # under `block`, output waits for the input's verdict
            stream = turn.moderation.gate(stream)
        async with contextlib.aclosing(stream) as chunks:
            async for chunk in chunks:
                yield chunk
                if chunk.finish_reason is not None:
                    return
                if turn.translator.tool_calls_exhausted:
                    # Closing the engine stream unfinished cancels the engine request.
                    yield GenerateChunk(finish_reason="stop")
                    return


def _observe(turn: Turn, events: list[ResponseStreamEvent]) -> None:
    """The output text of ``events`` to the turn's output moderation, if it has any."""
    if turn.moderation is not None and events:
        turn.moderation.observe(events)


def _record(turn: Turn) -> None:
    response = turn.response
    metrics.REQUESTS.labels(response.status or "unknown").inc()
    metrics.TIER_REQUESTS.labels(turn.tier, response.status or "unknown").inc()
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
