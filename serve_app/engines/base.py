"""The engine contract shared by the vLLM engine and the simulated CPU engine.

An engine knows nothing of the Responses API or of harmony's message structure: it takes
prompt token ids and sampling settings and streams new token ids. That keeps the GPU replica
lean and lets any token-level engine sit behind the ingress.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class SamplingSettings:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    # Harmony's <|return|> and <|call|>: sampling stops after either.
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSettings
    # The routing key (prompt_cache_key or a derived one); engines may log it, never need it.
    session_id: str | None = None


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
    error: str | None = None
    # The engine replica that served the request (set on the first chunk by the deployment).
    replica: str | None = None
    # Seconds from the request reaching the engine replica to its first output token, on the
    # chunk that carries that token: the engine's own queueing and prefill, without the routing
    # and transport in front of it. An engine that models its time (the simulated one) sets it
    # from its model; otherwise the deployment measures it.
    engine_ttft_s: float | None = None

    def merge(self, later: GenerateChunk) -> GenerateChunk:
        """One chunk standing for ``self`` followed by ``later`` (used to coalesce a stream)."""
        return GenerateChunk(
            token_ids=self.token_ids + later.token_ids,
            finish_reason=later.finish_reason or self.finish_reason,
            num_prompt_tokens=later.num_prompt_tokens or self.num_prompt_tokens,
            num_cached_tokens=max(self.num_cached_tokens, later.num_cached_tokens),
            error=later.error or self.error,
            replica=self.replica or later.replica,
            engine_ttft_s=self.engine_ttft_s
            if self.engine_ttft_s is not None
            else later.engine_ttft_s,
        )


class EngineError(RuntimeError):
    """The engine failed to serve a request (surfaced to clients as ``response.failed``)."""

    def __init__(self, message: str, code: str = "server_error") -> None:
        super().__init__(message)
        self.code = code


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

    async def check_health(self) -> None:  # noqa: B027 - optional hook
        """Raise if the engine cannot serve; Ray Serve restarts the replica then."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release the model's resources."""
