"""Plans: what one request will stream, as steps (tokens to emit, a failure, a pause, tokens
sampled under a constraint)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeAlias

from serve_app.constraints.sampling import DeadEnd, MaskedSampler
from serve_app.engines.base import EngineError


@dataclass(frozen=True)
class Emit:
    tokens: tuple[int, ...]
    # The default answer honours the request's stop tokens; a scripted turn plays out whole.
    honour_stop: bool


@dataclass(frozen=True)
class Fail:
    message: str
    code: str


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Sample:
    """Tokens drawn one decode step at a time under a constraint's mask, until its grammar
    ends (a stop token, honoured) or ``max_tokens`` cuts it."""

    sampler: MaskedSampler

    @property
    def tokens(self) -> Iterator[int]:
        while not self.sampler.done:
            try:
                token = self.sampler.next_token()
            except DeadEnd as exc:
                # A server fault (500 / response.failed), said plainly: the request was valid.
                raise EngineError(f"constrained decoding reached a dead end: {exc}") from exc
            yield token


Step: TypeAlias = Emit | Fail | Sleep | Sample
