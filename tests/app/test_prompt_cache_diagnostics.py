"""``prompt_cache_diagnostics`` through the openai SDK: each cache-miss reason built on purpose
(one thing changed between a response and a request naming it as ``comparison_response_id``),
a hit, a comparison not found (unknown, another key's), over SSE, in the background, on a
WebSocket with a connection's ``store: false`` response, on retrieve, and around a server-side
compaction (``context_management``: the turn compacting, and the turns after it)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from openai import OpenAI
from openai.types.responses.response import (
    PromptCacheDiagnosticsCacheHit,
    PromptCacheDiagnosticsCacheMiss,
    PromptCacheDiagnosticsComparisonResponseNotFound,
)

from tests.support import MODEL, OTHER_API_KEY
from tests.support.weather_history import HISTORY, TOOLS
from tests.support.websocket import until_terminal

# Long instructions: a prompt of several blocks, so a divergence has a place to be found.
INSTRUCTIONS = "Answer briefly and precisely. " * 40
TOOL = {
    "type": "function",
    "name": "get_time",
    "description": "The current time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SCHEMA_FORMAT = {
    "type": "json_schema",
    "name": "answer",
    "schema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    "strict": True,
}


def _base(**changes: Any) -> dict[str, Any]:
    """The baseline request, with ``changes``."""
    return {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "input": "What is prompt caching?",
        "prompt_cache_key": "diagnostics-base",
        **changes,
    }


def _compared(client: OpenAI, comparison_id: str, **request: Any):
    return client.responses.create(
        **request, prompt_cache_options={"comparison_response_id": comparison_id}
    )


def _miss(response) -> PromptCacheDiagnosticsCacheMiss:
    diagnostics = response.prompt_cache_diagnostics
    assert isinstance(diagnostics, PromptCacheDiagnosticsCacheMiss), diagnostics
    assert diagnostics.cache_missed_tokens + diagnostics.comparison_reusable_tokens == (
        response.usage.input_tokens
    )
    return diagnostics


def test_no_comparison_no_diagnostics(client: OpenAI) -> None:
    assert client.responses.create(**_base()).prompt_cache_diagnostics is None


# Settings the cache is keyed by: nothing of the comparison's prompt is reusable. (The app
# serves one model: ``model_changed``, a comparison made by a deployment serving another, is in
# tests/unit/serving/turn/test_cache_diagnostics.py, two apps on one store.)
@pytest.mark.parametrize(
    ("reason", "changes"),
    [
        ("prompt_cache_key_changed", {"prompt_cache_key": "diagnostics-other"}),
        ("verbosity_changed", {"text": {"verbosity": "low"}}),
        ("service_tier_changed", {"service_tier": "flex"}),
    ],
)
def test_a_changed_cache_key_setting_is_its_reason(
    client: OpenAI, reason: str, changes: dict[str, Any]
) -> None:
    baseline = client.responses.create(**_base())
    diagnostics = _miss(_compared(client, baseline.id, **_base(**changes)))
    assert diagnostics.reason == reason
    assert diagnostics.comparison_reusable_tokens == 0


# Settings rendered into the prompt: the tokens before them are reusable, not after.
@pytest.mark.parametrize(
    ("reason", "changes"),
    [
        ("tools_changed", {"tools": [TOOL]}),
        ("text_format_changed", {"text": {"format": SCHEMA_FORMAT}}),
        ("reasoning_effort_changed", {"reasoning": {"effort": "high"}}),
        ("input_changed", {"input": "What is a KV cache?"}),
    ],
)
def test_a_changed_prompt_setting_is_its_reason_and_counts_from_the_divergence(
    client: OpenAI, reason: str, changes: dict[str, Any]
) -> None:
    baseline = client.responses.create(**_base())
    diagnostics = _miss(_compared(client, baseline.id, **_base(**changes)))
    assert diagnostics.reason == reason
    assert 0 < diagnostics.comparison_reusable_tokens < baseline.usage.input_tokens
    if reason == "input_changed":  # the instructions before the input are all reusable
        assert diagnostics.comparison_reusable_tokens > baseline.usage.input_tokens - 64


def test_the_first_reason_in_openais_order_is_answered(client: OpenAI) -> None:
    baseline = client.responses.create(**_base())
    changed = _base(tools=[TOOL], reasoning={"effort": "high"}, input="Something else")
    assert _miss(_compared(client, baseline.id, **changed)).reason == "tools_changed"


def test_a_compacted_context_is_context_compacted(client: OpenAI) -> None:
    baseline = client.responses.create(model=MODEL, input=HISTORY, tools=TOOLS)
    compacted = client.responses.compact(model=MODEL, input=HISTORY, extra_body={"tools": TOOLS})
    items = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    resumed = _compared(client, baseline.id, model=MODEL, input=items, tools=TOOLS)
    assert _miss(resumed).reason == "context_compacted"


# Server-side compaction (tests/app/test_context_management.py): the scripted engine writes the
# summary; HISTORY renders to about 1,300 tokens, over the threshold.
COMPACT = [{"type": "compaction", "compact_threshold": 1000}]
ASK = {"role": "user", "content": "CM-ASK: and what should I wear?"}
NEXT = {"role": "user", "content": "CM-NEXT: and tomorrow?"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_compacting_server_side_is_context_compacted(client: OpenAI, stream: bool) -> None:
    """The answer is generated from the compacted prompt (its ``usage``): against a response
    from before, that prompt keeps only what precedes the history (system and tools)."""
    before = client.responses.create(model=MODEL, input=HISTORY, tools=TOOLS)
    request = {
        "model": MODEL,
        "previous_response_id": before.id,
        "input": [ASK],
        "tools": TOOLS,
        "context_management": COMPACT,
        "prompt_cache_options": {"comparison_response_id": before.id},
    }
    if stream:
        with client.responses.stream(**request) as events:
            carrying = [event.response for event in events if hasattr(event, "response")]
        compacting = carrying[-1]
        # The prompt as sent continues the comparison's; the answer's is the compacted one.
        assert isinstance(carrying[0].prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)
    else:
        compacting = client.responses.create(**request)
    assert [item.type for item in compacting.output] == ["compaction", "message"]
    diagnostics = _miss(compacting)
    assert diagnostics.reason == "context_compacted"
    assert 0 < diagnostics.comparison_reusable_tokens < compacting.usage.input_tokens
    # Kept so on the stored response.
    assert client.responses.retrieve(compacting.id).prompt_cache_diagnostics == diagnostics


@pytest.mark.parametrize("stateful", [True, False])
def test_a_turn_after_a_server_side_compaction(client: OpenAI, stateful: bool) -> None:
    """Compared with a response from before the compaction: ``context_compacted``; with the
    compacting response (its prompt is the compacted one, which the turn continues): a hit.
    Chained by ``previous_response_id`` or stateless (the output appended to the input)."""
    before = client.responses.create(model=MODEL, input=[*HISTORY, ASK], tools=TOOLS)
    compacting = client.responses.create(
        model=MODEL, input=[*HISTORY, ASK], tools=TOOLS, context_management=COMPACT
    )
    assert compacting.output[0].type == "compaction"
    if stateful:
        turn = {"previous_response_id": compacting.id, "input": [NEXT]}
    else:
        appended = [
            item.model_dump(exclude_none=True, warnings=False) for item in compacting.output
        ]
        turn = {"input": [*HISTORY, ASK, *appended, NEXT], "store": False}
    turn |= {"model": MODEL, "tools": TOOLS, "context_management": COMPACT}
    after_before = _compared(client, before.id, **turn)
    assert "compaction" not in [item.type for item in after_before.output]  # not compacted again
    diagnostics = _miss(after_before)
    assert diagnostics.reason == "context_compacted"
    assert 0 < diagnostics.comparison_reusable_tokens < after_before.usage.input_tokens
    after_compacting = _compared(client, compacting.id, **turn)
    assert isinstance(after_compacting.prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)


def test_a_websocket_turn_compacting_compares_its_compacted_prompt(client: OpenAI) -> None:
    """On a connection, with its ``store: false`` responses: the compacting turn against the
    one before is ``context_compacted``; the next turn against the compacting one, a hit."""
    turn = {"model": MODEL, "tools": TOOLS, "store": False}
    with client.responses.connect() as connection:
        connection.response.create(**turn, input=[*HISTORY, ASK])
        before = until_terminal(connection)[-1].response
        turn["context_management"] = COMPACT
        connection.response.create(
            **turn,
            input=[*HISTORY, ASK],
            prompt_cache_options={"comparison_response_id": before.id},
        )
        compacting = until_terminal(connection)[-1].response
        connection.response.create(
            **turn,
            input=[NEXT],
            previous_response_id=compacting.id,
            prompt_cache_options={"comparison_response_id": compacting.id},
        )
        after = until_terminal(connection)[-1].response
    assert compacting.output[0].type == "compaction"
    assert _miss(compacting).reason == "context_compacted"
    assert isinstance(after.prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)


def test_a_continuation_is_a_hit_as_is_the_same_request(client: OpenAI) -> None:
    baseline = client.responses.create(**_base())
    again = _compared(client, baseline.id, **_base())
    assert isinstance(again.prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)
    continued = _compared(
        client, baseline.id, **_base(input="And more?"), previous_response_id=baseline.id
    )
    assert isinstance(continued.prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)
    # Kept on the stored response: retrieve answers the same.
    assert client.responses.retrieve(continued.id).prompt_cache_diagnostics == (
        continued.prompt_cache_diagnostics
    )


def test_an_unknown_or_another_keys_response_is_not_found_and_the_request_runs(
    client: OpenAI,
) -> None:
    unknown = _compared(client, "resp_" + uuid.uuid4().hex, **_base())
    assert unknown.status == "completed"
    assert isinstance(
        unknown.prompt_cache_diagnostics, PromptCacheDiagnosticsComparisonResponseNotFound
    )
    other = OpenAI(base_url=client.base_url, api_key=OTHER_API_KEY, max_retries=0, timeout=60)
    theirs = other.responses.create(**_base())
    mine = _compared(client, theirs.id, **_base())
    assert isinstance(
        mine.prompt_cache_diagnostics, PromptCacheDiagnosticsComparisonResponseNotFound
    )
    # Their own comparison with it is found.
    assert isinstance(
        _compared(other, theirs.id, **_base()).prompt_cache_diagnostics,
        PromptCacheDiagnosticsCacheHit,
    )


def test_over_sse_every_event_carries_the_diagnostics(client: OpenAI) -> None:
    baseline = client.responses.create(**_base())
    with client.responses.stream(
        **_base(reasoning={"effort": "low"}),
        prompt_cache_options={"comparison_response_id": baseline.id},
    ) as stream:
        events = [event for event in stream if hasattr(event, "response")]
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    for event in events:
        assert event.response.prompt_cache_diagnostics.reason == "reasoning_effort_changed"


def test_a_background_response_keeps_its_diagnostics(client: OpenAI) -> None:
    baseline = client.responses.create(**_base())
    started = _compared(client, baseline.id, **_base(service_tier="priority"), background=True)
    assert started.prompt_cache_diagnostics.reason == "service_tier_changed"
    deadline = time.monotonic() + 30
    while (done := client.responses.retrieve(started.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert done.status == "completed"
    assert done.prompt_cache_diagnostics.reason == "service_tier_changed"


def test_a_websocket_compares_with_its_own_store_false_response(client: OpenAI) -> None:
    with client.responses.connect() as connection:
        connection.response.create(**_base(), store=False)
        first = until_terminal(connection)[-1].response
        connection.response.create(
            **_base(tools=[TOOL]),
            store=False,
            prompt_cache_options={"comparison_response_id": first.id},
        )
        events = until_terminal(connection)
        connection.response.create(
            **_base(input="Next?"),
            store=False,
            previous_response_id=first.id,
            prompt_cache_options={"comparison_response_id": first.id},
        )
        continued = until_terminal(connection)[-1].response
    assert events[0].type == "response.created"
    assert events[0].response.prompt_cache_diagnostics.reason == "tools_changed"
    assert _miss(events[-1].response).reason == "tools_changed"
    assert isinstance(continued.prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)
    # Over HTTP that store: false response is not found (the connection's memory only).
    over_http = _compared(client, first.id, **_base())
    assert isinstance(
        over_http.prompt_cache_diagnostics, PromptCacheDiagnosticsComparisonResponseNotFound
    )
