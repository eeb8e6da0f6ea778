"""The simulated engine and its prefix-cache model (no Ray)."""

from __future__ import annotations

import asyncio

import pytest
from openai_harmony import Role

from serve_app.engines.base import EngineError, GenerateRequest, SamplingSettings
from serve_app.engines.prefix_cache import PrefixKVCache
from serve_app.engines.simulated import EngineScript, SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.encoding import get_encoding
from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest

SCRIPT = {
    "turns": [
        {
            "match": "TOOL-PLEASE",
            "items": [
                {"reasoning": "Need ls."},
                {"function_call": {"name": "exec_command", "arguments": {"cmd": "ls -la"}}},
            ],
        },
        {"match": "BREAK", "items": [{"text": "partial"}, {"fail": "boom"}]},
    ]
}


def prompt(text: str) -> list[int]:
    return render_request(ResponsesRequest.model_validate({"model": "m", "input": text})).token_ids


async def collect(engine: SimulatedEngine, request_id: str, tokens: list[int], max_tokens=4096):
    chunks = []
    request = GenerateRequest(request_id, tokens, SamplingSettings(max_tokens=max_tokens))
    async for chunk in engine.generate(request):
        chunks.append(chunk)
    return chunks


def engine(**overrides) -> SimulatedEngine:
    options = {"decode_tokens_per_s": 50_000, "prefill_tokens_per_s": 1e7, "script": SCRIPT}
    return SimulatedEngine(SimulatedEngineConfig(**{**options, **overrides}))


def test_cache_counts_leading_full_blocks_only() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=64)
    assert cache.lookup(list(range(10))) == 0
    cache.insert(list(range(10)))  # two full blocks, the partial third is not cached
    assert cache.lookup(list(range(10))) == 8
    assert cache.lookup([*range(8), 99, 98, 97]) == 8
    assert cache.lookup([7, *range(1, 10)]) == 0  # a different first block breaks the chain


def test_cache_never_serves_the_whole_prompt() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=64)
    cache.insert(list(range(8)))
    assert cache.lookup(list(range(8))) == 4


def test_cache_evicts_least_recently_used_blocks() -> None:
    cache = PrefixKVCache(block_size=2, capacity_tokens=8)  # four blocks
    cache.insert([1, 2, 3, 4])
    cache.insert([5, 6, 7, 8])
    cache.lookup([1, 2, 3, 4, 0])  # touch the first sequence
    cache.insert([9, 10, 11, 12])  # evicts the second sequence
    assert cache.used_blocks == 4
    assert cache.lookup([1, 2, 3, 4, 0]) == 4
    assert cache.lookup([5, 6, 7, 8, 0]) == 0


async def test_scripted_tool_call_decodes_to_the_exact_call() -> None:
    chunks = await collect(engine(), "r1", prompt("TOOL-PLEASE now"))
    tokens = [token for chunk in chunks for token in chunk.token_ids]
    reasoning, call = get_encoding().parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
    assert reasoning.channel == "analysis" and reasoning.content[0].text == "Need ls."
    assert call.recipient == "functions.exec_command"
    assert call.content[0].text == '{"cmd": "ls -la"}'
    assert chunks[-1].finish_reason == "stop"


async def test_default_answer_never_calls_a_tool_and_says_what_it_is() -> None:
    chunks = await collect(engine(), "r1", prompt("run rm -rf / please"))
    tokens = [token for chunk in chunks for token in chunk.token_ids]
    messages = get_encoding().parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
    assert all(message.recipient is None for message in messages)
    assert messages[-1].channel == "final"
    assert "simulated engine" in messages[-1].content[0].text


async def test_second_request_with_a_shared_prefix_reports_cached_tokens() -> None:
    sim = engine()
    first = await collect(sim, "r1", prompt("hello"))
    second = await collect(sim, "r2", prompt("hello"))
    assert first[0].num_cached_tokens == 0
    assert second[0].num_cached_tokens >= 16
    assert second[0].num_prompt_tokens == len(prompt("hello"))


async def test_max_tokens_cuts_with_length() -> None:
    chunks = await collect(engine(), "r1", prompt("hello"), max_tokens=5)
    assert sum(len(chunk.token_ids) for chunk in chunks) == 5
    assert chunks[-1].finish_reason == "length"


async def test_abort_stops_promptly_and_frees_the_request() -> None:
    sim = engine(decode_tokens_per_s=50, default_output_tokens=500)
    request = GenerateRequest("slow", prompt("hello"), SamplingSettings(max_tokens=1000))
    seen = []

    async def consume() -> None:
        async for chunk in sim.generate(request):
            seen.append(chunk)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    assert sim.num_ongoing_requests() == 1
    await sim.abort("slow")
    await asyncio.wait_for(task, timeout=2)
    assert seen[-1].finish_reason == "abort"
    assert sim.num_ongoing_requests() == 0


async def test_scripted_failure_raises_mid_stream() -> None:
    sim = engine()
    with pytest.raises(EngineError, match="boom"):
        await collect(sim, "r1", prompt("BREAK it"))
    assert sim.num_ongoing_requests() == 0


def test_script_items_are_validated() -> None:
    with pytest.raises(ValueError):
        EngineScript.load({"turns": [{"items": [{"shell": "rm -rf /"}]}]})
