"""What the engine is asked for a turn's prompt cache: the breakpoints it writes, the ttl, and
no caching at all for ``mode: explicit`` with no breakpoint (a cache salt of its own)."""

from __future__ import annotations

from serve_app.harmony.render import RenderedPrompt
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import new_response_id
from serve_app.serving.turn.engine_request import engine_request
from tests.support import MODEL


def asked(options: dict | None, breakpoints: tuple[int, ...] = (), request_id: str = "resp_1"):
    body = {"model": MODEL, "input": "x"}
    if options is not None:
        body["prompt_cache_options"] = options
    request = ResponsesRequest.model_validate(body)
    prompt = RenderedPrompt(
        token_ids=list(range(200)),
        tools=ToolRegistry.from_request(request),
        breakpoints=breakpoints,
    )
    return engine_request(
        request, prompt, request_id=request_id, max_tokens=16, session_id="k", cache_salt="tenant"
    )


def test_implicit_caches_under_the_tenants_salt_with_the_latest_three_marks() -> None:
    request = asked(None, breakpoints=(10, 20, 30, 40))
    assert request.cache_salt == "tenant"
    assert request.cache_breakpoints == (20, 30, 40)
    assert request.cache_ttl_s == 30 * 60


def test_explicit_with_marks_caches_under_the_tenants_salt_with_the_latest_four() -> None:
    request = asked({"mode": "explicit", "ttl": "12h"}, breakpoints=(5, 10, 20, 30, 40))
    assert request.cache_salt == "tenant"
    assert request.cache_breakpoints == (10, 20, 30, 40)
    assert request.cache_ttl_s == 12 * 3600


def test_explicit_without_a_mark_caches_nothing_anyone_shares() -> None:
    first = asked({"mode": "explicit"}, request_id=new_response_id())
    second = asked({"mode": "explicit"}, request_id=new_response_id())
    # A salt per request: nothing cached before matches it, nothing after will name it.
    assert first.cache_salt not in ("tenant", None, second.cache_salt)
    assert first.cache_breakpoints == ()
    # Within what vLLM's server accepts of a salt (docs/vllm.md "Cache salt").
    salt = first.cache_salt.replace("tenant", "0" * 32)
    assert 0 < len(salt) <= 128 and not any(bad in salt for bad in "@/\\\0")
