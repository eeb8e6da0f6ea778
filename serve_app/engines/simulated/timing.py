"""The simulated engine's time model: prefill of the *uncached* prompt tokens (one prefill at a
time, first come first served, as prefills share one accelerator) and decode steps that slow
down as more requests decode together. Only the timing is wall-clock; ``first_token_at`` is the
model's, so a benchmark on a busy host measures where requests were sent, not how late the
host's timers fired."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from serve_app.engines.base import EngineError, FinishReason, GenerateRequest
from serve_app.engines.prefix_cache import CacheHit, PrefixKVCache
from serve_app.engines.simulated.config import SimulatedEngineConfig
from serve_app.engines.simulated.steps import Fail, Sample, Sleep, Step

# Below this many seconds ahead of schedule the decode loop does not sleep (timer resolution):
# at high decode rates several tokens then go out in one chunk, keeping the modelled rate.
_MIN_SLEEP_S = 0.001


@dataclass
class Running:
    """One admitted request."""

    request: GenerateRequest
    aborted: bool = False
    decoding: bool = False
    # The pending wait, resolved early by `abort` so the stream ends promptly.
    wakeup: asyncio.Future[None] | None = None
    # Block keys of the prompt once its KV exists (after prefill): the output extends them.
    prompt_keys: list[int] | None = None
    output: list[int] = field(default_factory=list)
    # Monotonic times: arrival, and by the time model, the end of prefill and the first token.
    arrived: float = field(default_factory=time.monotonic)
    prefilled_at: float = 0.0
    first_token_at: float = 0.0


class Aborted(Exception):
    """The request was aborted while waiting."""


class TimingModel:
    """One replica's modelled accelerator: the prefill queue and the requests decoding."""

    def __init__(self, config: SimulatedEngineConfig, cache: PrefixKVCache) -> None:
        self.config = config
        self.cache = cache
        self.num_decoding = 0
        # Requests waiting for prefill, the one prefilling first.
        self._prefill_queue: deque[Running] = deque()
        # When the modelled accelerator finishes the prefills admitted so far (monotonic).
        self._prefill_free_at = 0.0

    def finished(self, running: Running) -> None:
        """``running`` leaves the engine (ended, failed or aborted)."""
        if running.decoding:
            self.num_decoding -= 1

    async def prefill(self, running: Running) -> CacheHit:
        """Prefill the prompt's uncached tokens; returns what the cache served of the prompt.

        Prefills run one at a time in arrival order because they share one accelerator: cache
        misses cost the replica throughput, not only the request latency, which is what makes
        cache-affine routing matter. The cache is looked up when the prefill starts, as vLLM's
        scheduler does, so a request queued behind one with the same prefix reuses its blocks.

        Each prefill ends at a time the model sets (after the arrival and the prefill before
        it), not after a sleep of its length: a timer that fires late on a busy host delays
        this prefill, not every one queued behind it.
        """
        queue = self._prefill_queue
        queue.append(running)
        try:
            while queue[0] is not running:
                await self.sleep(running, None)  # woken when the request ahead leaves
            prompt = running.request.prompt_token_ids
            session, salt = running.request.session_id, running.request.cache_salt
            # A shared tier in another process answers for the prompt first (one call; its
            # wall time is not the model's: the pull is charged at the pull rate below).
            await self.cache.prefetch_shared(prompt, salt)
            hit = self.cache.lookup_hit(prompt, session, salt)
            running.prefilled_at = max(running.arrived, self._prefill_free_at) + self.prefill_s(
                len(prompt), hit
            )
            self._prefill_free_at = running.prefilled_at
            await self.sleep(running, running.prefilled_at - time.monotonic())
            # vLLM caches a prompt's full blocks once computed, before the request ends.
            running.prompt_keys = self.cache.insert(prompt, hit.keys, session, salt)
            return hit
        finally:
            was_first = queue[0] is running
            queue.remove(running)
            if was_first and running.prompt_keys is None:
                # Aborted mid-prefill: the accelerator is free now, not when it would have ended.
                self._prefill_free_at = min(self._prefill_free_at, time.monotonic())
            if was_first and queue:
                resolve(queue[0].wakeup)

    def prefill_s(self, prompt_tokens: int, hit: CacheHit) -> float:
        """The accelerator's time for a prompt: its uncached tokens at the prefill rate, and
        what it loads from the CPU tier and pulls from the shared tier at their rates. A load
        holds the request's place in the prefill queue (the requests behind wait for it), as
        the router's TTFT model counts it (``serve_app.routing.ttft``)."""
        config = self.config
        return (
            (prompt_tokens - hit.tokens) / config.prefill_tokens_per_s
            + hit.loaded_tokens / config.kv_load_tokens_per_s
            + hit.pulled_tokens / config.shared_kv_pull_tokens_per_s
        )

    async def sleep(self, running: Running, seconds: float | None) -> None:
        """Sleep (None: until woken) that `abort` cuts short; raises `Aborted` once aborted."""
        if running.aborted:
            raise Aborted
        if seconds is None or seconds > 0:
            loop = asyncio.get_running_loop()
            wakeup: asyncio.Future[None] = loop.create_future()
            timer = None if seconds is None else loop.call_later(seconds, resolve, wakeup)
            running.wakeup = wakeup
            try:
                await wakeup
            finally:
                if timer is not None:
                    timer.cancel()
                running.wakeup = None
        if running.aborted:
            raise Aborted

    def step_seconds(self) -> float:
        others = max(self.num_decoding - 1, 0)
        return (1 + self.config.batch_slowdown * others) / self.config.decode_tokens_per_s

    async def decode(
        self, running: Running, plan: list[Step]
    ) -> AsyncIterator[tuple[list[int], FinishReason | None]]:
        """Play ``plan`` one token per decode step; the last pair carries the finish reason.

        A token exists once its step has passed, timed from the modelled end of prefill, so
        ``running.first_token_at`` is the time model's and a late timer is caught up on.
        Tokens that fall due within the timer resolution go out together, so a fast decode
        rate costs few wake-ups and still keeps its rate.
        """
        running.decoding = True
        self.num_decoding += 1
        sampling = running.request.sampling
        stop_ids = frozenset(sampling.stop_token_ids)
        output = running.output
        pending: list[int] = []
        due = running.prefilled_at
        try:
            if sampling.max_tokens <= len(output):
                yield [], "length"
                return
            for step in plan:
                if isinstance(step, Fail):
                    if pending:
                        yield pending, None
                        pending = []
                    raise EngineError(step.message, code=step.code)
                if isinstance(step, Sleep):
                    if pending:
                        yield pending, None
                        pending = []
                    await self.sleep(running, step.seconds)
                    due = time.monotonic()
                    continue
                honour_stop = isinstance(step, Sample) or step.honour_stop
                for token in step.tokens:
                    due += self.step_seconds()
                    wait = due - time.monotonic()
                    if wait > _MIN_SLEEP_S:
                        if pending:
                            yield pending, None
                            pending = []
                        await self.sleep(running, wait)
                    elif running.aborted:
                        raise Aborted
                    if not output:
                        running.first_token_at = due
                    pending.append(token)
                    output.append(token)
                    if honour_stop and token in stop_ids:
                        yield pending, "stop"
                        return
                    if len(output) >= sampling.max_tokens:
                        yield pending, "length"
                        return
            yield pending, "stop"
        except Aborted:
            yield pending, "abort"


def resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
