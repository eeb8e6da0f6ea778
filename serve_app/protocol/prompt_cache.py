"""Prompt-cache options, as the openai SDK types them (``openai.types.beta.response_create_params
.PromptCacheOptions``, the response's ``PromptCacheOptions`` and ``PromptCacheDiagnostics`` in
``openai.types.responses.response``; ``prompt_cache_breakpoint`` on content parts in
``openai.types.beta.beta_response_input_text``). No harmony, no Ray.

- ``mode``: ``implicit`` (default) adds one breakpoint of the server's choosing and writes up to
  the latest three explicit ones; ``explicit`` writes up to the latest four explicit ones and,
  with none, caches nothing.
- ``ttl``: the minimum lifetime of every breakpoint the request writes (``30m`` default, or
  ``12h``); what this server honours is in docs/routing.md.
- ``prewarm``: prepare the cache, generate nothing (overrides ``generate``).
- ``comparison_response_id``: asks for ``prompt_cache_diagnostics`` against that response.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from serve_app.protocol.request_base import Lenient

PromptCacheMode = Literal["implicit", "explicit"]
PromptCacheTTL = Literal["30m", "12h"]
DEFAULT_MODE: PromptCacheMode = "implicit"
DEFAULT_TTL: PromptCacheTTL = "30m"
# Breakpoints a request may write: four explicit ones, or three beside the implicit one.
MAX_WRITTEN_BREAKPOINTS = 4


class PromptCacheOptions(Lenient):
    """``prompt_cache_options`` of a request (every field optional, strict JSON types)."""

    mode: PromptCacheMode | None = None
    ttl: PromptCacheTTL | None = None
    prewarm: bool | None = None
    comparison_response_id: str | None = Field(default=None, min_length=1)


class PromptCacheBreakpoint(Lenient):
    """``prompt_cache_breakpoint`` on a content part: marks the exact end of a reusable prefix."""

    mode: Literal["explicit"]
    ttl: PromptCacheTTL | None = None


# Seconds each ttl asks a breakpoint to live at least (what the engine request carries).
TTL_SECONDS: dict[str, int] = {"30m": 30 * 60, "12h": 12 * 3600}
# Content parts a client may mark: what it wrote (the SDK's ``BetaResponseInputText``,
# ``BetaResponseInputImage``, ``BetaResponseInputFile``). Output parts are the model's.
BREAKPOINT_PART_TYPES = frozenset({"input_text", "input_image", "input_file"})


def applied(options: PromptCacheOptions | None) -> PromptCacheOptions:
    """The options as applied (the Response's ``prompt_cache_options``): mode and ttl with
    their defaults, and the comparison asked for."""
    options = options or PromptCacheOptions()
    return PromptCacheOptions(
        mode=options.mode or DEFAULT_MODE,
        ttl=options.ttl or DEFAULT_TTL,
        comparison_response_id=options.comparison_response_id,
    )


def is_prewarm(options: PromptCacheOptions | None) -> bool:
    return options is not None and options.prewarm is True


def written_breakpoints(mode: PromptCacheMode | None, positions: list[int]) -> tuple[int, ...]:
    """The breakpoints a request writes, of the explicit ones at ``positions`` (prompt order):
    the latest four with ``explicit``, the latest three beside the implicit one otherwise."""
    keep = MAX_WRITTEN_BREAKPOINTS - (0 if mode == "explicit" else 1)
    return tuple(positions[-keep:])
