"""The simulated engine's time model: prefill of the *uncached* prompt tokens (one prefill at a
time, as prefills share one accelerator, earliest deadline first) and decode steps that slow
down as more requests decode together. Only the timing is wall-clock; ``first_token_at`` is the
model's, so a benchmark on a busy host measures where requests were sent, not how late the
host's timers fired.

Scheduling (issue 49), as vLLM's ``priority`` policy schedules once the engine wrapper gives it
each request's deadline (serve_app/engines/vllm_engine.py):

- the accelerator prefills one request at a time; when it is free, the waiting request with
  the earliest deadline (its arrival plus its ``deadline_s``; ties: arrival) takes it. A
  deadline fixed at arrival is aging: a waiting request's effective priority improves by a
  second each second, so a request of a later deadline is passed only by requests arriving
  less than the difference of the deadlines after it, and is never starved;
- with ``prefill_chunk_tokens``, a prefill runs a chunk's time at once (vLLM's chunked prefill:
  a step's ``max_num_batched_tokens``), and between chunks the earliest deadline waiting takes
  the accelerator: an urgent request waits for the chunk running at most, the prefill it cut in
  on resumes after it. vLLM continues the prefills already running first and gives a new one
  what is left of the step's token budget, so there an urgent request shares steps with them
  rather than going ahead whole: the same work, split differently. Without it a prefill, once
  started, runs whole (the model before issue 49);
- decode slots (``max_num_seqs``, vLLM's): a request holds one from the start of its prefill to
  its end, and one that finds none free waits, handed the next in the same deadline order.
  Nobody is preempted for a slot (vLLM preempts only when KV blocks run out, the lowest
  priority first: KV exhaustion is not modelled here);
- every request past its prefill decodes in one batch, one token a step each, whatever its
  tier: the step slows with the batch (``batch_slowdown``), for every request alike, as vLLM's
  batch has no priority. So a flood of low-tier requests slows an urgent one's decode by the
  slots it holds, which ``max_num_seqs`` bounds.
"""

from __future__ import annotations

import asyncio
import itertools
import time
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
    # Scheduling: arrival order among equal deadlines; when its prefill started (the model's
    # time: its queue wait ends there); whether it holds a decode slot and, if it had to wait
    # for one, since when.
    seq: int = 0
    started_at: float | None = None
    holds_slot: bool = False
    slot_at: float = 0.0

    @property
    def due(self) -> float:
        """Its deadline: arrival plus its tier's ``deadline_s`` (fixed at arrival: aging)."""
        return self.arrived + self.request.deadline_s

    @property
    def queue_s(self) -> float | None:
        """Seconds it waited before its prefill started, by the model (None: not started)."""
        return None if self.started_at is None else self.started_at - self.arrived


class Aborted(Exception):
    """The request was aborted while waiting."""


class TimingModel:
    """One replica's modelled accelerator: the prefill queue and the requests decoding."""

    def __init__(self, config: SimulatedEngineConfig, cache: PrefixKVCache) -> None:
        self.config = config
        self.cache = cache
        self.num_decoding = 0
        # Requests wanting the accelerator: not started, or between chunks of their prefill.
        self._waiting: list[Running] = []
        # The request prefilling now (a chunk, or its whole prefill), if any.
        self._busy: Running | None = None
        # When the modelled accelerator finishes the prefill work admitted so far (monotonic).
        self._prefill_free_at = 0.0
        # Decode slots held, and when the latest was given back while requests waited for one.
        self._slots_held = 0
        self._slot_freed_at = 0.0
        self._arrivals = itertools.count()

    def finished(self, running: Running) -> None:
        """``running`` leaves the engine (ended, failed or aborted)."""
        if running.decoding:
            self.num_decoding -= 1
        if running.holds_slot:
            limit = self.config.max_num_seqs
            was_full = limit is not None and self._slots_held >= limit
            running.holds_slot = False
            self._slots_held -= 1
            if was_full and self._waiting:
                # The request that waited for this slot starts no sooner than now.
                self._slot_freed_at = time.monotonic()
            self._dispatch()

    async def prefill(self, running: Running) -> CacheHit:
        """Prefill the prompt's uncached tokens; returns what the cache served of the prompt.

        Prefills run one at a time, earliest deadline first (the module docstring), because
        they share one accelerator: cache misses cost the replica throughput, not only the
        request latency, which is what makes cache-affine routing matter. The cache is looked
        up when the prefill starts, as vLLM's scheduler does, so a request queued behind one
        with the same prefix reuses its blocks.

        Each chunk ends at a time the model sets (after the arrival and the work before it),
        not after a sleep of its length: a timer that fires late on a busy host delays this
        prefill, not every one queued behind it.
        """
        running.seq = next(self._arrivals)
        self._waiting.append(running)
        hit: CacheHit | None = None
        remaining_s = 0.0  # the accelerator's time its prefill has left, once started
        try:
            while True:
                while not self._is_turn(running):
                    await self.sleep(running, None)  # woken when it may be its turn
                self._busy = running
                if hit is None:
                    hit = await self._start(running)
                    remaining_s = self.prefill_s(len(running.request.prompt_token_ids), hit)
                start = max(running.arrived, running.slot_at, self._prefill_free_at)
                if running.started_at is None:
                    running.started_at = start
                chunk_s = self._chunk_s(remaining_s)
                self._prefill_free_at = start + chunk_s
                await self.sleep(running, self._prefill_free_at - time.monotonic())
                remaining_s -= chunk_s
                self._busy = None
                if remaining_s <= 0:
                    break
                self._dispatch()  # a request due sooner may take the next chunk
            running.prefilled_at = self._prefill_free_at
            # vLLM caches a prompt's full blocks once computed, before the request ends.
            session, salt = running.request.session_id, running.request.cache_salt
            prompt = running.request.prompt_token_ids
            running.prompt_keys = self.cache.insert(prompt, hit.keys, session, salt)
            return hit
        finally:
            self._waiting.remove(running)
            if self._busy is running:
                # Aborted mid-chunk: the accelerator is free now, not when it would have ended.
                self._busy = None
                self._prefill_free_at = min(self._prefill_free_at, time.monotonic())
            self._dispatch()

    async def _start(self, running: Running) -> CacheHit:
        """The request's prefill starts: it takes its decode slot and looks its prompt up."""
        running.holds_slot = True
        self._slots_held += 1
        running.slot_at = self._slot_freed_at
        prompt = running.request.prompt_token_ids
        session, salt = running.request.session_id, running.request.cache_salt
        # A shared tier in another process answers for the prompt first (one call; its
        # wall time is not the model's: the pull is charged at the pull rate below).
        await self.cache.prefetch_shared(prompt, salt)
        return self.cache.lookup_hit(prompt, session, salt)

    def _chunk_s(self, remaining_s: float) -> float:
        """The accelerator's time the next chunk of a prefill takes: all that is left, or at
        most a chunk of ``prefill_chunk_tokens`` at the prefill rate."""
        chunk_tokens = self.config.prefill_chunk_tokens
        if chunk_tokens is None:
            return remaining_s
        return min(remaining_s, chunk_tokens / self.config.prefill_tokens_per_s)

    def _is_turn(self, running: Running) -> bool:
        return self._busy is None and self._next() is running

    def _next(self) -> Running | None:
        """Who takes the accelerator when it is free: among the waiting requests that hold a
        decode slot or can take one, those that had arrived by then (the model's time), the
        earliest deadline, then the earliest arrival; if none had, the first to arrive."""
        free_slot = self.config.max_num_seqs is None or self._slots_held < self.config.max_num_seqs
        eligible = [waiting for waiting in self._waiting if waiting.holds_slot or free_slot]
        if not eligible:
            return None
        free_at = max(self._prefill_free_at, self._slot_freed_at)
        arrived = [waiting for waiting in eligible if waiting.arrived <= free_at]
        if not arrived:
            return min(eligible, key=lambda waiting: waiting.seq)
        return min(arrived, key=lambda waiting: (waiting.due, waiting.seq))

    def _dispatch(self) -> None:
        """Wake the request whose turn it is, if the accelerator is free."""
        if self._busy is None and (head := self._next()) is not None:
            resolve(head.wakeup)

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
