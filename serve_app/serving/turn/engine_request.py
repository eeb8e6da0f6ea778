"""What the engine is asked for a turn (`engine_request`): the prompt's token ids, the
request's sampling, harmony's stop tokens, what the completion must obey, and its tier's
scheduling (issue 49)."""

from __future__ import annotations

from serve_app.config import ServedTier, ServiceTierArgs
from serve_app.constraints import build as constraint_build
from serve_app.constraints.spec import CompletionConstraint
from serve_app.engines.base import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    GenerateRequest,
    SamplingSettings,
)
from serve_app.harmony.encoding import STOP_TOKENS
from serve_app.harmony.render import RenderedPrompt
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.prompt_cache import (
    DEFAULT_TTL,
    TTL_SECONDS,
    applied,
    written_breakpoints,
)
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.service_tiers import PRIORITY

OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"
# The cache salt's prefix of a request that caches nothing (its response id follows).
NO_CACHE_SALT = "no-cache:"


def engine_request(
    request: ResponsesRequest,
    prompt: RenderedPrompt,
    *,
    request_id: str,
    max_tokens: int,
    session_id: str | None,
    cache_salt: str | None,
    tier: ServedTier = "default",
    tiers: ServiceTierArgs | None = None,
) -> GenerateRequest:
    """What the engine is asked for a turn: the prompt's token ids and the request's sampling
    (the engine's defaults where it sets none), stopping at harmony's ``<|return|>`` or
    ``<|call|>``, and what the completion must obey. ``session_id``: the routing key;
    ``cache_salt``: the caller's prefix-cache namespace (``routing.keys.cache_salt``);
    ``tier``: the tier it is served at, whose rank and deadline (``tiers``: the app's settings)
    the engine schedules it by."""
    deadlines = (tiers or ServiceTierArgs()).deadline_s
    return GenerateRequest(
        request_id=request_id,
        prompt_token_ids=prompt.token_ids,
        sampling=SamplingSettings(
            max_tokens=max_tokens,
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            top_p=DEFAULT_TOP_P if request.top_p is None else request.top_p,
            stop_token_ids=STOP_TOKENS,
            logprobs=_logprobs_wanted(request),
        ),
        session_id=session_id,
        cache_salt=_cache_salt(request, prompt, cache_salt, request_id),
        constraint=_constraint(request, prompt.tools),
        cache_breakpoints=written_breakpoints(_mode(request), list(prompt.breakpoints)),
        cache_ttl_s=TTL_SECONDS[applied(request.prompt_cache_options).ttl or DEFAULT_TTL],
        priority=PRIORITY[tier],
        deadline_s=deadlines[tier],
    )


def _mode(request: ResponsesRequest) -> str | None:
    return request.prompt_cache_options.mode if request.prompt_cache_options else None


def _cache_salt(
    request: ResponsesRequest, prompt: RenderedPrompt, salt: str | None, request_id: str
) -> str | None:
    """The caller's prefix-cache namespace, unless the request asked for no caching at all
    (``mode: explicit`` with no breakpoint): then a namespace of its own, which nothing was
    cached under and no other request will name, so it neither reuses nor leaves a prefix."""
    if _mode(request) == "explicit" and not prompt.breakpoints:
        return f"{NO_CACHE_SALT}{request_id}:{salt or ''}"
    return salt


def _logprobs_wanted(request: ResponsesRequest) -> int | None:
    """Alternatives per token to ask the engine for: only when the client includes the output
    text's logprobs (then ``top_logprobs``, 0 meaning the sampled token's own only)."""
    if OUTPUT_TEXT_LOGPROBS not in request.include:
        return None
    return request.top_logprobs or 0


def _constraint(request: ResponsesRequest, tools: ToolRegistry) -> CompletionConstraint | None:
    """What the engine must enforce, or None where there is nothing to enforce: plain text,
    a non-strict ``text.format``, ``tool_choice`` auto over tools that are all non-strict
    functions or grammar-less custom tools (Codex's usual request), and ``tool_choice`` none
    with no tools to forbid. Only those get None: a constraint costs a grammar compile (cached
    per distinct grammar) and a mask per token in the engine."""
    if request.tool_choice == "none" and not request.tools:
        return None
    return constraint_build.from_request(request, tools)
