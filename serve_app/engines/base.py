"""The engine contract shared by the vLLM engine and the simulated CPU engine.

An engine knows nothing of the Responses API or of harmony's message structure: it takes
prompt token ids and sampling settings and streams new token ids. That keeps the GPU replica
lean and lets any token-level engine sit behind the ingress.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Literal

from serve_app.constraints.spec import CompletionConstraint
from serve_app.engines.kv_events import KVEventSink

# Part of the contract (sampling defaults, chunk logprobs), defined where the protocol and
# harmony layers can use them too.
from serve_app.values import DEFAULT_TEMPERATURE, DEFAULT_TOP_P, TokenLogprob

logger = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "abort", "error"]
SERVER_ERROR = "server_error"
# Codes of an `EngineError` that is the client's fault (vLLM rejecting the prompt or the
# request): a 400 `invalid_request_error` with that code, not a 500 `server_error`.
CLIENT_ERROR_CODES = frozenset({"invalid_prompt", "invalid_request"})


@dataclass(frozen=True)
class SamplingSettings:
    max_tokens: int
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    # Harmony's <|return|> and <|call|>: sampling stops after either.
    stop_token_ids: tuple[int, ...] = ()
    # Alternatives wanted per sampled token (0: the sampled token's logprob only); None: no
    # logprobs at all, and chunks carry none.
    logprobs: int | None = None


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSettings
    # The routing key (prompt_cache_key or a derived one, scoped by the caller's API key);
    # engines name it in their KV-cache events and may log it, never need it.
    session_id: str | None = None
    # The tenant's prefix-cache namespace: a prompt is served only from blocks cached under
    # the same salt (vLLM's ``cache_salt``, hashed into the first block). None: unsalted, the
    # blocks every unsalted request shares (an open API, one tenant).
    cache_salt: str | None = None
    # What the completion must obey (issue 20), engine-neutral: each engine compiles it its own
    # way. None for a request that constrains nothing (the common case pays nothing).
    constraint: CompletionConstraint | None = None
    # The client's prompt-cache marks (issue 40): the token indexes where the prefixes it asked
    # to keep end (ascending; the latest written only), and the least time in seconds it asked
    # them kept. vLLM and the simulated engine cache every whole block of every prompt and
    # evict by LRU, so they honour neither; the request router and the replica's report keep
    # the conversation's home for at least the ttl (docs/routing.md).
    cache_breakpoints: tuple[int, ...] = ()
    cache_ttl_s: int | None = None
    # Scheduling (issue 49). An engine serves the requests waiting for it earliest deadline
    # first, this request's deadline being its arrival plus ``deadline_s`` (ties: arrival).
    # With a deadline fixed at arrival, a waiting request's effective priority improves with
    # its wait (one second a second), so a request with a later deadline is never starved: it
    # is passed only by requests arriving less than the difference of the two deadlines after
    # it. ``priority`` is the caller's class of the request, lower more urgent (vLLM's
    # convention; 0 the default): engines label what they report by it, and do not schedule
    # by it otherwise. ``deadline_s`` may be negative: the request waited before it reached
    # the engine (held by its caller) and is due already.
    priority: int = 0
    deadline_s: float = 0.0


@dataclass
class GenerateChunk:
    """New tokens since the previous chunk of the same request.

    ``finish_reason`` is set on the last chunk only. ``num_cached_tokens`` is the number of
    prompt tokens served from the engine's prefix cache; it is known from the first chunk on.
    """

    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    # Of num_cached_tokens, those loaded from a CPU tier behind the GPU cache and pulled from
    # a shared tier (issue 40), by an engine that models its tiers (the simulated one); 0 from
    # one that does not report them apart (vLLM's engine here).
    num_loaded_tokens: int = 0
    num_pulled_tokens: int = 0
    # On an "error" chunk: what failed, and its code (an `EngineError`'s, e.g. invalid_prompt).
    error: str | None = None
    error_code: str | None = None
    # The engine replica that served the request (set on the first chunk by the deployment).
    replica: str | None = None
    # Seconds from the request reaching the engine replica to its first output token, on the
    # chunk that carries that token: the engine's own queueing and prefill, without the routing
    # and transport in front of it. An engine that models its time (the simulated one) sets it
    # from its model; otherwise the deployment measures it.
    engine_ttft_s: float | None = None
    # Of ``engine_ttft_s``, the seconds the request waited before its prefill started (for
    # other requests' prefills, or for a decode slot), on the same chunk; None: the engine
    # does not say (issue 49: the queue wait by tier).
    engine_queue_s: float | None = None
    # One entry per id of ``token_ids`` when the request asked for logprobs, else None (the
    # common case pays nothing per token).
    logprobs: list[TokenLogprob] | None = None

    def merge(self, later: GenerateChunk) -> GenerateChunk:
        """One chunk standing for ``self`` followed by ``later`` (used to coalesce a stream)."""
        merged = replace(
            self,
            token_ids=list(self.token_ids),
            logprobs=None if self.logprobs is None else list(self.logprobs),
        )
        merged.absorb(later)
        return merged

    def absorb(self, later: GenerateChunk) -> None:
        """Make this chunk stand for itself followed by ``later``, in place: for a chunk the
        caller owns (a pending chunk in a channel's outbox), no copy per token."""
        self.token_ids.extend(later.token_ids)
        self.finish_reason = later.finish_reason or self.finish_reason
        self.num_prompt_tokens = later.num_prompt_tokens or self.num_prompt_tokens
        self.num_cached_tokens = max(self.num_cached_tokens, later.num_cached_tokens)
        self.num_loaded_tokens = max(self.num_loaded_tokens, later.num_loaded_tokens)
        self.num_pulled_tokens = max(self.num_pulled_tokens, later.num_pulled_tokens)
        self.error = later.error or self.error
        self.error_code = later.error_code or self.error_code
        self.replica = self.replica or later.replica
        if self.engine_ttft_s is None:
            self.engine_ttft_s = later.engine_ttft_s
        if self.engine_queue_s is None:
            self.engine_queue_s = later.engine_queue_s
        if later.logprobs is not None:
            # A chunk without logprobs (e.g. the last one, with no tokens) adds none.
            if self.logprobs is None:
                self.logprobs = list(later.logprobs)
            else:
                self.logprobs.extend(later.logprobs)


class EngineError(RuntimeError):
    """The engine failed to serve a request (surfaced to clients as ``response.failed``).
    ``code`` in `CLIENT_ERROR_CODES`: the request was at fault, not the engine."""

    def __init__(self, message: str, code: str = SERVER_ERROR) -> None:
        super().__init__(message)
        self.code = code


def error_chunk(request_id: str, exc: Exception) -> GenerateChunk:
    """The last chunk of a request the engine raised ``exc`` for, wherever the engine runs
    (an engine replica, or in-process): an `EngineError` keeps its message and code; anything
    else is a server fault, named by its type only (its text may show internals)."""
    if isinstance(exc, EngineError):
        logger.warning("request %s failed in the engine (%s): %s", request_id, exc.code, exc)
        return GenerateChunk(finish_reason="error", error=str(exc), error_code=exc.code)
    logger.error("request %s: unexpected engine error", request_id, exc_info=exc)
    return GenerateChunk(finish_reason="error", error=type(exc).__name__, error_code=SERVER_ERROR)


class Engine(abc.ABC):
    """One inference engine, owned by one engine replica."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model (or its stand-in). Called once before any request."""

    @abc.abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream the completion of ``request``; the last chunk carries a finish reason."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop generating for ``request_id`` and free its resources (idempotent)."""

    @abc.abstractmethod
    def num_ongoing_requests(self) -> int:
        """Requests admitted and not yet finished or aborted."""

    def subscribe_kv_events(self, sink: KVEventSink) -> bool:
        """Hand this engine's KV-cache events (``serve_app.engines.kv_events``) to ``sink``
        from now on; whether the engine publishes any (the default: none)."""
        return False

    def kv_load_tokens_per_s(self) -> float | None:
        """How fast the engine loads KV from its CPU tier to its GPU, tokens/s (configured or
        measured); None: it has no CPU tier (the default)."""
        return None

    async def check_health(self) -> None:  # noqa: B027 - optional hook
        """Raise if the engine cannot serve; Ray Serve restarts the replica then."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release the model's resources."""
