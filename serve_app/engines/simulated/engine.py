"""The simulated engine: the `Engine` contract over the script, the harmony tokens, the time
model, the logprob stand-ins and constraint sampling (the package docstring says what it does)."""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import AsyncIterator, Sequence

from serve_app.constraints.sampling import MaskedSampler
from serve_app.constraints.spec import CompletionConstraint
from serve_app.engines.base import Engine, EngineError, GenerateChunk, GenerateRequest, TokenLogprob
from serve_app.engines.kv_events import KVEvent, KVEventSink
from serve_app.engines.prefix_cache import PrefixCacheStats, PrefixKVCache
from serve_app.engines.simulated.config import SimulatedEngineConfig, shared_tier
from serve_app.engines.simulated.constrained import (
    compile_matcher,
    to_sample,
    turn_violation,
    vocabulary_loaded,
)
from serve_app.engines.simulated.logprobs import token_logprobs
from serve_app.engines.simulated.script import load_script
from serve_app.engines.simulated.steps import Emit, Sample, Step
from serve_app.engines.simulated.timing import Aborted, Running, TimingModel, resolve
from serve_app.engines.simulated.tokens import harmony_tokens, last_message_text

logger = logging.getLogger(__name__)


class SimulatedEngine(Engine):
    """Token ids in, harmony completion token ids out, with modelled cache and timing."""

    def __init__(self, config: SimulatedEngineConfig | None = None) -> None:
        self.config = config or SimulatedEngineConfig()
        # Its KV-cache events go to whoever subscribed (the engine deployment's summary).
        self._kv_sinks: list[KVEventSink] = []
        self.cache = PrefixKVCache(
            self.config.block_size,
            self.config.kv_cache_tokens,
            on_events=self._publish,
            cpu_capacity_tokens=self.config.cpu_kv_cache_tokens,
            shared=shared_tier(self.config),
        )
        self.script = load_script(self.config.script)
        self.timing = TimingModel(self.config, self.cache)
        self._plans: dict[int, list[Step]] = {}
        # Scripted turns already checked against a constraint: None if the turn obeys it, else
        # why not.
        self._checked: dict[tuple[int, CompletionConstraint], str | None] = {}
        self._running: dict[str, Running] = {}

    # -- Engine contract ---------------------------------------------------------------------

    async def start(self) -> None:
        # Load the vocabulary and encode every scripted turn now, so a bad script fails the
        # replica's start-up rather than a request.
        for index in range(len(self.script.turns)):
            self._turn_plan(index)
        harmony_tokens()
        logger.info(
            "simulated engine (no model weights): %d scripted turns, KV cache %d tokens",
            len(self.script.turns),
            self.config.kv_cache_tokens,
        )

    def num_ongoing_requests(self) -> int:
        return len(self._running)

    def subscribe_kv_events(self, sink: KVEventSink) -> bool:
        self._kv_sinks.append(sink)
        return True

    def kv_load_tokens_per_s(self) -> float | None:
        return self.config.kv_load_tokens_per_s if self.config.cpu_kv_cache_tokens else None

    def _publish(self, events: Sequence[KVEvent]) -> None:
        for sink in self._kv_sinks:
            sink(events)

    async def abort(self, request_id: str) -> None:
        running = self._running.get(request_id)
        if running is None:
            return  # finished, never seen or already aborted: idempotent
        running.aborted = True
        resolve(running.wakeup)

    async def shutdown(self) -> None:
        for request_id in list(self._running):
            await self.abort(request_id)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        if request.request_id in self._running:
            raise EngineError(f"request id {request.request_id!r} is already running")
        running = Running(request)
        self._running[request.request_id] = running
        prompt = request.prompt_token_ids
        counts = {"num_prompt_tokens": len(prompt), "num_cached_tokens": 0}
        try:
            try:
                hit = await self.timing.prefill(running)
                counts["num_cached_tokens"] = hit.tokens
                counts["num_loaded_tokens"] = hit.loaded_tokens
                counts["num_pulled_tokens"] = hit.pulled_tokens
            except Aborted:
                yield GenerateChunk(finish_reason="abort", **counts)
                return
            if request.constraint is not None:
                await vocabulary_loaded()
            stamped = False
            decode = self.timing.decode(running, self._plan(request))
            async with contextlib.aclosing(decode) as steps:
                async for token_ids, finish in steps:
                    chunk = GenerateChunk(token_ids=token_ids, finish_reason=finish, **counts)
                    if request.sampling.logprobs is not None:
                        chunk.logprobs = self._logprobs(running, token_ids)
                    if token_ids and not stamped:
                        chunk.engine_ttft_s = running.first_token_at - running.arrived
                        chunk.engine_queue_s = running.queue_s
                        stamped = True
                    yield chunk
        finally:
            if running.prompt_keys is not None:  # aborted before prefill: nothing to cache
                self.cache.insert(
                    [*prompt, *running.output],
                    running.prompt_keys,
                    request.session_id,
                    request.cache_salt,
                )
            self.timing.finished(running)
            del self._running[request.request_id]

    def _logprobs(self, running: Running, token_ids: list[int]) -> list[TokenLogprob]:
        # The chunk's tokens are the last ones of the output so far.
        first = len(running.output) - len(token_ids)
        top = running.request.sampling.logprobs or 0
        return [
            token_logprobs(self.config.seed, first + offset, token, top)
            for offset, token in enumerate(token_ids)
        ]

    # -- Metrics ---------------------------------------------------------------------------

    def cache_stats(self) -> PrefixCacheStats:
        """The prefix-cache model's counters, for metrics."""
        return self.cache.stats()

    # -- What to say ----------------------------------------------------------------------

    def _plan(self, request: GenerateRequest) -> list[Step]:
        prompt = request.prompt_token_ids
        index = self.script.turn_index(last_message_text(prompt)) if self.script.turns else None
        if index is not None:
            if request.constraint is not None:
                self._check_turn(index, request.constraint)
            return self._turn_plan(index)
        # Same prompt and seed, same answer; Random(int) is stable across processes.
        seed = hash((self.config.seed, tuple(prompt)))
        sampled = to_sample(request.constraint)
        if sampled is not None:
            return [Sample(MaskedSampler(compile_matcher(sampled), seed))]
        rng = random.Random(seed)
        length = self.config.default_output_tokens
        tokens = harmony_tokens().default_answer(len(prompt), length, rng)
        return [Emit(tuple(tokens), honour_stop=True)]

    def _check_turn(self, index: int, constraint: CompletionConstraint) -> None:
        key = (index, constraint)
        if key not in self._checked:
            self._checked[key] = turn_violation(self._turn_plan(index), constraint)
        violation = self._checked[key]
        if violation is not None:
            raise EngineError(
                f"simulated engine: scripted turn {index} breaks the request's constraint "
                f"({violation}); the test script is misconfigured"
            )

    def _turn_plan(self, index: int) -> list[Step]:
        plan = self._plans.get(index)
        if plan is None:
            plan = self._plans[index] = harmony_tokens().turn_plan(self.script.turns[index])
        return plan
