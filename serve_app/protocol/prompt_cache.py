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
