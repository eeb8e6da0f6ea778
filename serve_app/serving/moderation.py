"""A request's ``moderation``, judged by gpt-oss-safeguard on its own engine deployment.

`Moderator` asks the classifier (an `EngineClient` on the ``ModerationEngine`` deployment, the
engine contract reused: token ids in, token ids out) for one judgement of a text under the
operator's policy. Every way a judgement can fail (the deployment raises, refuses, dies, takes
longer than ``timeout_s``, answers what cannot be read) comes back as a `Failure`, the SDK's
``error`` result: never an exception into the response, never a hang.

`TurnModeration` is one response's: the input judged beside the prefill (started with the
engine request, not before it), the output judged in windows as it streams, and what a
``block`` decides: a flagged input holds back all output and ends the response (`gate`), a
flagged output window stops it (`output_blocked`). The event loop
(serve_app/serving/turn/events.py) drives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace

from openai.types.responses import ResponseStreamEvent
from openai.types.responses.response import Moderation

from serve_app.config import ModerationArgs
from serve_app.engines.base import GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.harmony.moderation import (
    classifier_answer,
    classifier_prompt,
    count_tokens,
    stop_tokens,
)
from serve_app.protocol import moderation as judged
from serve_app.protocol.errors import RateLimited
from serve_app.protocol.moderation import (
    Failure,
    Judgement,
    ModerationOptions,
    ModerationResults,
    Verdict,
)
from serve_app.protocol.requests import (
    FunctionCallOutputItem,
    MessageItem,
    ResponsesRequest,
)
from serve_app.serving import metrics
from serve_app.serving.engine.client import EngineClient

logger = logging.getLogger(__name__)

# The events whose text is the output judged: what the client is shown as text (answers,
# preambles, refusals). Reasoning and tool arguments are not.
_OUTPUT_TEXT_EVENTS = ("response.output_text.delta", "response.refusal.delta")


class Moderator:
    """Judges texts under the operator's policy with the moderation deployment."""

    def __init__(self, args: ModerationArgs, engine: EngineClient) -> None:
        self.args = args
        self._engine = engine
        self.policy = judged.load_policy(args.policy_file)
        self.categories = judged.policy_categories(self.policy)

    @property
    def model(self) -> str:
        return self.args.model

    async def judge(self, text: str, request_id: str, side: str = "input") -> Judgement:
        """``text`` judged under the policy; a `Failure` when it could not be. Counted by
        ``side`` and outcome in the metrics."""
        started = time.monotonic()
        judgement = await self._judge(text, request_id)
        if isinstance(judgement, Failure):
            outcome = judgement.code
        else:
            outcome = "flagged" if judgement.flagged else "passed"
            metrics.MODERATION_SECONDS.observe(time.monotonic() - started)
        metrics.MODERATION_JUDGEMENTS.labels(side, outcome).inc()
        return judgement

    async def _judge(self, text: str, request_id: str) -> Judgement:
        if not text.strip():
            return judged.clean(self.categories)  # nothing to judge, nothing flagged
        try:
            async with asyncio.timeout(self.args.timeout_s):
                answer = await self._ask(text, request_id)
        except TimeoutError:
            logger.warning("moderation %s: no answer within %ss", request_id, self.args.timeout_s)
            message = f"The moderation model did not answer within {self.args.timeout_s}s."
            return Failure(judged.TIMEOUT, message)
        except RateLimited:
            return Failure(judged.UNAVAILABLE, "The moderation model is at capacity.")
        except Exception as error:  # the deployment failed or died: an error result, not ours
            logger.warning("moderation %s: the classifier failed: %r", request_id, error)
            return Failure(judged.FAILED, f"The moderation model failed: {type(error).__name__}")
        if isinstance(answer, Failure):
            return answer
        return judged.parse_answer(answer, self.categories, self.args.threshold)

    async def _ask(self, text: str, request_id: str) -> str | Failure | None:
        """The classifier's final answer (None: it gave none), or its engine's failure."""
        args = self.args
        prompt = classifier_prompt(
            self.policy,
            text,
            effort=args.reasoning_effort,
            max_content_tokens=args.max_content_tokens,
        )
        sampling = SamplingSettings(
            max_tokens=args.max_answer_tokens, temperature=0.0, stop_token_ids=stop_tokens()
        )
        request = GenerateRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling)
        tokens: list[int] = []
        # Closed on leaving (a timeout too): that aborts the classifier's request.
        async with contextlib.aclosing(self._engine.stream(request)) as chunks:
            async for chunk in chunks:
                tokens.extend(chunk.token_ids)
                if chunk.finish_reason == "error":
                    return Failure(judged.FAILED, f"The moderation model failed: {chunk.error}")
                if chunk.finish_reason is not None:
                    break
        return classifier_answer(tokens)


def input_text(request: ResponsesRequest) -> str:
    """The text of the request's input judged as the response's input: its messages and the
    tool outputs it brings (the stored history it continues was judged when it was input)."""
    parts: list[str] = []
    for item in request.input_items:
        if isinstance(item, MessageItem | FunctionCallOutputItem):
            parts.append(item.text)
        else:
            text = getattr(item, "text", None)
            if isinstance(text, str):
                parts.append(text)
    return "\n\n".join(part for part in parts if part)


class TurnModeration:
    """One response's moderation: its input judgement, its output windows, and the block
    they decide. The results go on the terminal Response (`settle`)."""

    def __init__(
        self, moderator: Moderator, options: ModerationOptions, response_id: str, text: str
    ) -> None:
        self._moderator = moderator
        self._options = options
        self._response_id = response_id
        self._input_text = text
        self._input: asyncio.Task[Judgement] | None = None
        self._windows: list[asyncio.Task[Judgement]] = []
        # Output text not judged yet, and the window judged before it (judged again with it,
        # so text split across two windows is judged whole).
        self._pending = ""
        self._previous = ""
        self.blocked = False  # a `block` side was flagged: the response ends content_filter

    @property
    def blocks_input(self) -> bool:
        return self._options.input_mode == "block"

    def begin(self) -> None:
        """Judge the input now, beside the engine's prefill (once)."""
        if self._input is None:
            judgement = self._moderator.judge(self._input_text, f"{self._response_id}-mod-input")
            self._input = asyncio.create_task(judgement, name="moderation input")

    # --- the input: held output until its verdict -------------------------------------------

    async def gate(self, chunks: AsyncIterator[GenerateChunk]) -> AsyncIterator[GenerateChunk]:
        """``chunks`` as they come, except that, under ``block``, tokens wait for the input's
        verdict: released at once when it passes (or cannot be judged: an error result does
        not block), and never when it flags, the stream then ending with a ``stop`` chunk
        (``blocked`` set; closing the engine stream aborts the engine request). The chunks
        without tokens pass (the first says the engine took the request)."""
        # The gate closes first (its read of the next chunk cancelled and awaited), then the
        # engine stream: closed under a read still running, it raised RuntimeError
        # ("aclose(): asynchronous generator is already running") and the terminal was lost.
        async with (
            contextlib.aclosing(chunks),
            contextlib.aclosing(self._gated(chunks)) as gated,
        ):
            async for chunk in gated:
                yield chunk

    async def _gated(self, chunks: AsyncIterator[GenerateChunk]) -> AsyncIterator[GenerateChunk]:
        verdict = self._input
        passed = verdict is not None and verdict.done() and not _flagged(verdict.result())
        if verdict is None or not self.blocks_input or passed:
            async for chunk in chunks:
                yield chunk
            return
        iterator = aiter(chunks)
        held: GenerateChunk | None = None
        following: asyncio.Future[GenerateChunk] | None = None
        try:
            while not verdict.done():
                if following is None:
                    following = asyncio.ensure_future(anext(iterator))
                await asyncio.wait({following, verdict}, return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    continue  # the verdict came first: it decides below
                try:
                    chunk = following.result()
                except StopAsyncIteration:
                    following = None
                    break
                following = None
                if not chunk.token_ids and chunk.finish_reason is None and held is None:
                    yield chunk
                    continue
                held = chunk if held is None else held.merge(chunk)
                if chunk.finish_reason is not None:
                    await asyncio.wait({verdict})
            if _flagged(await verdict):
                self.blocked = True
                counts = held or GenerateChunk()
                yield replace(counts, token_ids=[], logprobs=None, finish_reason="stop")
                return
            if held is not None:
                yield held
                if held.finish_reason is not None:
                    return
            if following is not None:
                try:
                    yield await following
                except StopAsyncIteration:
                    return
                following = None
            async for chunk in iterator:
                yield chunk
        finally:
            if following is not None and not following.done():
                following.cancel()  # the engine stream ends with it: its request is aborted
                with contextlib.suppress(BaseException):
                    await following

    # --- the output: windows as it streams ----------------------------------------------------

    def observe(self, events: Iterable[ResponseStreamEvent]) -> None:
        """Take the output text ``events`` carry; a full window is judged now, beside the
        stream (nothing waits for it)."""
        for event in events:
            if event.type in _OUTPUT_TEXT_EVENTS:
                self._pending += getattr(event, "delta", "")
        window = self._moderator.args.output_window_tokens
        # A token holds at least one character: below `window` characters, no count needed.
        if len(self._pending) >= window and count_tokens(self._pending) >= window:
            self._judge_window()

    def _judge_window(self) -> None:
        text = self._previous + self._pending
        self._previous, self._pending = self._pending, ""
        request_id = f"{self._response_id}-mod-output-{len(self._windows)}"
        judgement = self._moderator.judge(text, request_id, side="output")
        task = asyncio.create_task(judgement, name="moderation output")
        self._windows.append(task)

    @property
    def output_blocked(self) -> bool:
        """Under ``block``, a window judged so far was flagged: output stops here."""
        if self._options.output_mode != "block":
            return False
        return any(
            task.done() and not task.cancelled() and _flagged(task.result())
            for task in self._windows
        )

    # --- the end -----------------------------------------------------------------------------

    async def settle(self, *, wait: bool = True) -> Moderation:
        """Both sides' results for the terminal Response. ``wait``: the output's last window
        is judged and every judgement awaited (each is bounded by ``timeout_s``), and a
        flagged ``block`` side sets ``blocked``; otherwise (the response failed or was
        cancelled) what is not judged yet is an error result."""
        if wait:
            if self._pending.strip():
                self._judge_window()
            running = [t for t in (self._input, *self._windows) if t is not None]
            if running:
                await asyncio.wait(running)
        input_judgement = _outcome(self._input)
        output_judgement = judged.combine(
            [_outcome(task) for task in self._windows], self._moderator.categories
        )
        if not self._windows:
            output_judgement = judged.clean(self._moderator.categories)
        if (self.blocks_input and _flagged(input_judgement)) or (
            self._options.output_mode == "block" and _flagged(output_judgement)
        ):
            self.blocked = True
        self.cancel()
        results = ModerationResults(self._moderator.model, input_judgement, output_judgement)
        return results.response_field()

    def cancel(self) -> None:
        """Stop the judgements still running (the response is over)."""
        for task in (self._input, *self._windows):
            if task is not None and not task.done():
                task.cancel()


def _flagged(judgement: Judgement) -> bool:
    return isinstance(judgement, Verdict) and judgement.flagged


def _outcome(task: asyncio.Task[Judgement] | None) -> Judgement:
    if task is None or not task.done() or task.cancelled():
        return Failure(judged.INCOMPLETE, "The response ended before moderation finished.")
    return task.result()
