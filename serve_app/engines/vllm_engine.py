"""The production engine: vLLM ``AsyncLLM`` (V1) on token ids, inside a Ray Serve replica.

Token ids in (rendered through the engine's renderer) and out; vLLM's engine metrics on Ray's
metrics endpoint; constrained decoding on vLLM's ``guidance`` backend, checked token by token;
tensor parallel workers in the replica's placement group. What we read in vLLM's source to write
this, its traps and what differs by version: docs/vllm.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from serve_app.constraints.grammar import to_lark
from serve_app.constraints.matcher import ConstraintError, compile_grammar
from serve_app.constraints.spec import FREE, CompletionConstraint
from serve_app.engines.base import (
    Engine,
    EngineError,
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    SamplingSettings,
    TokenLogprob,
)
from serve_app.engines.kv_events import KVEventSink
from serve_app.engines.vllm_config import VLLMEngineConfig, engine_config
from serve_app.engines.vllm_kv_events import KVEventSubscriber, new_endpoint, replay_endpoint
from serve_app.harmony.encoding import get_encoding

if TYPE_CHECKING:
    import llguidance
    from vllm import SamplingParams
    from vllm.inputs import EngineInput
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.loggers import StatLoggerFactory

logger = logging.getLogger(__name__)

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
# The logprob reported for a token of no probability (vLLM's -inf: masked by a grammar).
MIN_LOGPROB = -9999.0
# Every request has vLLM report the blocks it finds cached as well as those it stores (a
# BlockStored naming its session, KVCacheManager.get_computed_blocks): a prefix several
# conversations share is then counted for each, not only for the first to store it, and a
# BlockRemoved of it debits each (serve_app.routing.kv_summary). vLLM's default, "incremental",
# reports stored blocks only.
KV_CACHE_REPORT = {"kv_cache_report_mode": "full"}


class VLLMEngine(Engine):
    """One vLLM ``AsyncLLM`` per engine replica."""

    def __init__(self, config: VLLMEngineConfig) -> None:
        self._config = config
        self._engine: AsyncLLM | None = None
        self._in_flight: set[str] = set()
        self._kv_sinks: list[KVEventSink] = []
        self._kv_events: KVEventSubscriber | None = None
        # Requests' priorities count milliseconds from here (`deadline_priority`).
        self._epoch = time.monotonic()

    async def start(self) -> None:
        if self._engine is not None:
            return
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        endpoint = new_endpoint() if self._config.kv_cache_events else None
        args = self._config.engine_args_with_events(endpoint)
        if endpoint is not None:
            self._kv_events = KVEventSubscriber(
                endpoint, self._kv_sinks, replay=replay_endpoint(endpoint)
            )
            self._kv_events.start()
        vllm_config = await engine_config(args)
        disable_log_stats = bool(args.get("disable_log_stats", False))
        self._engine = AsyncLLM.from_vllm_config(
            vllm_config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=None if disable_log_stats else _stat_loggers(),
            enable_log_requests=bool(args.get("enable_log_requests", False)),
            disable_log_stats=disable_log_stats,
        )
        logger.info(
            "vLLM engine started: %s, tp=%d, executor=%s",
            self._config.model,
            self._config.tensor_parallel_size,
            self._config.executor_backend or "uni",
        )
        if self._config.constrains:
            await self._warm_up_constraints()

    def subscribe_kv_events(self, sink: KVEventSink) -> bool:
        self._kv_sinks.append(sink)
        return self._config.kv_cache_events

    def kv_load_tokens_per_s(self) -> float | None:
        """The CPU tier's configured load rate (None: no CPU tier, or no rate configured), for
        the replica's report."""
        if self._config.kv_transfer_config is None:
            return None
        return self._config.kv_load_tokens_per_s

    async def _warm_up_constraints(self) -> None:
        """One constrained token before Serve routes traffic here: the first request with
        structured outputs makes vLLM build its guidance backend (llguidance's view of the 200k
        vocabulary) and us our matcher's vocabulary, about 4 s on a 2-core CPU, which the
        first client would otherwise wait for."""
        request = GenerateRequest(
            request_id=f"warm-up-{uuid.uuid4().hex}",
            prompt_token_ids=_harmony_prompt(),
            sampling=SamplingSettings(max_tokens=1),
            constraint=CompletionConstraint(final=FREE),
        )
        try:
            async for _ in self.generate(request):
                pass
        except Exception:  # unconstrained requests can still be served; each constrained one
            # will fail with its own error
            logger.exception("vLLM engine: constrained decoding warm-up failed")
        else:
            logger.info("vLLM engine: constrained decoding warmed up")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        engine = self._running_engine()
        request_id = request.request_id
        if request_id in self._in_flight:
            raise EngineError(f"request {request_id} is already running", code="invalid_request")
        # Fixed on arrival, before rendering: the deadline counts from here.
        priority = deadline_priority(request.deadline_s, time.monotonic(), self._epoch)
        prompt = await _render(engine, request.prompt_token_ids, request.cache_salt)
        grammar = self._grammar(request.constraint)
        check = await self._constraint_check(grammar)
        params = _sampling_params(request.sampling, detokenize=False, grammar=grammar)
        num_prompt_tokens = len(request.prompt_token_ids)
        guard = _StopTokenGuard()
        self._in_flight.add(request_id)
        finished = False
        try:
            # aclosing: if we are closed at a yield, vLLM's generator is closed (and aborts) now,
            # not whenever it is garbage-collected.
            # session_id: vLLM names it in the KV events of the blocks this request stores or
            # finds cached (KV_CACHE_REPORT), which is how the KV summary knows them per
            # conversation. priority: the request's deadline, which vLLM's priority policy
            # schedules earliest first (`deadline_priority`).
            outputs = engine.generate(
                prompt, params, request_id, session_id=request.session_id, priority=priority
            )
            stamped = False
            async with contextlib.aclosing(outputs) as stream:
                async for output in stream:
                    chunk = _to_chunk(
                        output, num_prompt_tokens, guard, request.sampling.logprobs or 0
                    )
                    if chunk is None:
                        continue
                    if chunk.token_ids and not stamped:
                        chunk.engine_queue_s = _queue_s(output)
                        stamped = True
                    if check is not None:
                        check.follow(chunk.token_ids)
                    # No break after the last chunk: vLLM's generator ends by itself then, where
                    # closing it early would run its abort path for a finished request.
                    finished = chunk.finish_reason is not None
                    yield chunk
        except (asyncio.CancelledError, GeneratorExit, EngineError):
            raise
        except Exception as exc:
            raise _engine_error(exc) from exc
        finally:
            self._in_flight.discard(request_id)
            if not finished:
                # Cancelled (the caller went away), closed early or failed: stop generating and
                # free the KV blocks before the cancellation propagates. vLLM's own generate()
                # also aborts when it is the one cancelled; a second abort is a no-op.
                await self._abort_quietly(request_id)

    def _grammar(self, constraint: CompletionConstraint | None) -> str | None:
        """The Lark grammar vLLM enforces for ``constraint`` (None: unconstrained)."""
        if constraint is None:
            return None
        return to_lark(constraint, max_free_tokens=self._config.constraint_max_free_tokens)

    async def _constraint_check(self, grammar: str | None) -> _ConstraintCheck | None:
        """The replica's own matcher for ``grammar`` (None without one); refuses a grammar
        this engine cannot enforce rather than generating it unconstrained."""
        if grammar is None:
            return None
        if not self._config.constrains:
            raise EngineError(
                "this vLLM engine runs without a tokenizer (skip_tokenizer_init: true), so it "
                "cannot enforce the request's strict format, strict tools or tool_choice; load "
                "the model's tokenizer (the default) to serve such requests"
            )
        try:
            # The first call builds the vocabulary (about a second): not in the event loop.
            matcher = await asyncio.to_thread(compile_grammar, grammar)
        except ConstraintError as exc:
            raise EngineError(
                f"the request's constraint cannot be compiled: {exc}", code="invalid_request"
            ) from exc
        return _ConstraintCheck(matcher)

    async def abort(self, request_id: str) -> None:
        if self._engine is not None:
            await self._engine.abort(request_id)

    def num_ongoing_requests(self) -> int:
        """Requests vLLM itself still holds (an aborted one is gone at once), not our count."""
        if self._engine is None:
            return 0
        return self._engine.get_num_unfinished_requests()

    async def check_health(self) -> None:
        await self._running_engine().check_health()

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
        if self._kv_events is not None:
            await self._kv_events.stop()

    def _running_engine(self) -> AsyncLLM:
        if self._engine is None:
            raise EngineError("the vLLM engine is not running")
        return self._engine

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await self.abort(request_id)
        except Exception:  # the engine may be dead already; nothing is left to free then
            logger.warning("could not abort request %s", request_id, exc_info=True)


class _StopTokenGuard:
    """Keeps the stop token (``<|return|>``, ``<|call|>``) in the streamed ids.

    vLLM keeps it (docs/vllm.md); this only acts if a version drops it, since the harmony parser
    needs it to close the last message.
    """

    def __init__(self) -> None:
        self._last_token: int | None = None

    def apply(
        self, token_ids: list[int], stop_reason: object, finish: FinishReason | None
    ) -> list[int]:
        if token_ids:
            self._last_token = token_ids[-1]
        # stop_reason is the stop token id when a stop token ended the request (else a stop
        # string or None).
        if finish == "stop" and type(stop_reason) is int and self._last_token != stop_reason:
            token_ids = [*token_ids, stop_reason]
            self._last_token = stop_reason
        return token_ids


class _ConstraintCheck:
    """Follows one constrained completion token by token with our own llguidance matcher.

    vLLM masks the logits with the same grammar, so every token should pass; one that does not
    means the constraint was not applied (a dead end, a grammar held back, a vLLM change), and
    the request fails before that token reaches the client.
    """

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def follow(self, token_ids: Sequence[int]) -> None:
        for token in token_ids:
            if self._matcher.is_stopped():
                return  # the grammar ended with its stop token; nothing after it is sampled
            if not self._matcher.consume_token(token):
                raise EngineError(
                    f"constrained decoding failed: vLLM sampled token {token}, which the "
                    f"request's grammar does not allow ({self._matcher.get_error()})"
                )


async def _render(
    engine: AsyncLLM, token_ids: Sequence[int], cache_salt: str | None = None
) -> EngineInput:
    """The prompt as vLLM's renderer makes it: the engine takes rendered input, where a raw
    ``TokensPrompt`` is deprecated. Token ids are validated (vocabulary, ``max_model_len``) and
    wrapped, never tokenized or detokenized. ``cache_salt`` (the tenant's) rides on the prompt,
    where vLLM takes it: the renderer copies it to the engine input (``_process_tokens``), the
    request carries it, and its first block's hash includes it (``kv_cache_utils.
    generate_block_hash_extra_keys``), so the prompt hits only blocks of the same salt."""
    from vllm import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=list(token_ids))
    if cache_salt is not None:
        prompt["cache_salt"] = cache_salt
    try:
        (rendered,) = await engine.renderer.render_cmpl_async([prompt])
    except Exception as exc:
        raise _engine_error(exc) from exc
    return rendered


def deadline_priority(deadline_s: float, now: float, epoch: float) -> int:
    """vLLM's ``priority`` for a request arriving at ``now`` (monotonic) due ``deadline_s``
    later: its deadline, in milliseconds since ``epoch`` (the engine's start).

    vLLM's waiting queue under the ``priority`` policy is a heap of requests ordered by
    (``priority``, ``arrival_time``), lower first (vllm/v1/request.py ``Request.__lt__``,
    vllm/v1/core/sched/request_queue.py ``PriorityRequestQueue``), and it never changes a
    request's priority once submitted. A deadline fixed at arrival needs no change: ordering by
    it is ordering by a priority that improves a second for every second waited (aging), so a
    flex request is passed only by requests arriving within the tiers' difference of deadlines
    after it. Milliseconds: vLLM compares priorities as ints; equal ones go by arrival."""
    return round((now - epoch + deadline_s) * 1000)


def _queue_s(output: object) -> float | None:
    """The seconds vLLM held the request in its waiting queue (first scheduled less queued,
    engine-core times of its ``RequestStateStats``), known from the first output on; None when
    vLLM keeps no stats (``disable_log_stats``)."""
    stats = getattr(output, "metrics", None)
    queued = getattr(stats, "queued_ts", 0.0) or 0.0
    scheduled = getattr(stats, "scheduled_ts", 0.0) or 0.0
    if queued <= 0 or scheduled <= 0:
        return None
    return max(scheduled - queued, 0.0)


def _stat_loggers() -> list[StatLoggerFactory] | None:
    """vLLM's engine metrics (KV-cache use, prefix-cache hits, queues) recorded as Ray metrics,
    which Ray's metrics agent exports; its default logger's registry is in this process, where
    nothing scrapes it. Outside Ray (no ``ray.init()``), vLLM's default loggers."""
    import ray

    if not ray.is_initialized():
        return None
    from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

    return [RayPrometheusStatLogger]


def _harmony_prompt() -> list[int]:
    """A minimal prompt that ends where a completion starts (``<|start|>assistant``)."""
    text = "<|start|>user<|message|>hi<|end|><|start|>assistant"
    return get_encoding().encode(text, allowed_special="all")


def _sampling_params(
    settings: SamplingSettings,
    *,
    detokenize: bool,
    grammar: str | None = None,
) -> SamplingParams:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    # The whole completion's grammar; the guidance backend takes Lark as is.
    structured = None if grammar is None else StructuredOutputsParams(grammar=grammar)
    return SamplingParams(
        structured_outputs=structured,
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        stop_token_ids=list(settings.stop_token_ids),
        # k alternatives per sampled token (0: the sampled token's only); None asks for none.
        logprobs=settings.logprobs,
        # Special tokens are harmony's structure; keep them (this only concerns text anyway).
        skip_special_tokens=False,
        # Only affects stop *strings* in text; stop token ids are always in token_ids.
        include_stop_str_in_output=True,
        detokenize=detokenize,
        output_kind=RequestOutputKind.DELTA,
        extra_args=dict(KV_CACHE_REPORT),
    )


def _to_chunk(
    output: RequestOutput,
    num_prompt_tokens: int,
    guard: _StopTokenGuard,
    top_logprobs: int = 0,
) -> GenerateChunk | None:
    """Our chunk for one DELTA output; None for an empty, unfinished one."""
    completion = output.outputs[0] if output.outputs else None
    finish, error = _finish(output, completion)
    token_ids: list[int] = []
    if completion is not None:
        token_ids = guard.apply(list(completion.token_ids), completion.stop_reason, finish)
    if not token_ids and finish is None:
        return None
    logprobs = None
    if completion is not None and completion.logprobs is not None:
        logprobs = _token_logprobs(
            completion.token_ids, completion.logprobs, top_logprobs, len(token_ids)
        )
    return GenerateChunk(
        token_ids=token_ids,
        finish_reason=finish,
        num_prompt_tokens=num_prompt_tokens,
        num_cached_tokens=output.num_cached_tokens or 0,
        error=error,
        logprobs=logprobs,
    )


def _token_logprobs(
    sampled: Sequence[int], positions: Sequence[Mapping[int, Any]], top: int, length: int
) -> list[TokenLogprob]:
    """Our entries for a DELTA output's logprobs: one ``{token id: Logprob}`` per new token
    holding the sampled token (with its rank) and the ``top`` best by rank (1..top), so the
    sampled token is among them or one more. ``length``: the chunk's token count (the stop
    token guard may add one, which gets a placeholder: a stop token is never text)."""
    entries: list[TokenLogprob] = []
    for token, position in zip(sampled, positions, strict=False):
        best = sorted(
            (lp.rank, int(tid), _finite(lp.logprob))
            for tid, lp in position.items()
            if lp.rank is not None and lp.rank <= top
        )
        chosen = position.get(token)
        logprob = _finite(chosen.logprob) if chosen is not None else 0.0
        entries.append((logprob, tuple((tid, lp) for _, tid, lp in best[:top])))
    entries.extend((0.0, ()) for _ in range(length - len(entries)))
    return entries[:length]


def _finite(logprob: float) -> float:
    """``logprob``, with -inf (and NaN) as ``MIN_LOGPROB``: under a constraint vLLM computes
    logprobs after the grammar's mask, so every token the grammar forbids has -inf, and a
    position the grammar forces has no second alternative above it. JSON has no -inf (the
    Response would fail to serialize: a 500); a finite floor keeps the alternatives asked for."""
    value = float(logprob)
    return value if math.isfinite(value) else MIN_LOGPROB


def _finish(
    output: RequestOutput, completion: CompletionOutput | None
) -> tuple[FinishReason | None, str | None]:
    if not output.finished:
        return None, None
    reason = completion.finish_reason if completion is not None else None
    finish = _FINISH_REASONS.get(str(reason))
    if finish is None:  # "error", "repetition", or none given
        return "error", f"vLLM finished the request with reason {reason!r}"
    return finish, None


def _engine_error(exc: BaseException) -> EngineError:
    """An ``EngineError`` for what ``AsyncLLM.generate`` raised (the cause may be chained)."""
    if type(exc).__name__ == "EngineDeadError":
        return EngineError("the vLLM engine died; the replica will be restarted")
    cause = exc.__cause__ if type(exc).__name__ == "EngineGenerateError" else exc
    if cause is not None and _is_client_error(cause):
        return EngineError(str(cause), code="invalid_prompt")
    shown = cause if cause is not None else exc
    return EngineError(f"vLLM failed: {type(shown).__name__}: {shown}")


def _is_client_error(exc: BaseException) -> bool:
    # vLLM's VLLMValidationError is a ValueError; newer ones derive from VLLMClientError.
    names = {cls.__name__ for cls in type(exc).__mro__}
    return isinstance(exc, ValueError) or "VLLMClientError" in names
