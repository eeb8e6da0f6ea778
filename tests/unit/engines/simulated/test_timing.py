"""The simulated engine's time model with tiers behind its GPU cache (issue 40): a prefix the
GPU evicted is loaded from the CPU tier at the load rate, or pulled from the shared tier at the
pull rate, instead of computed; without tiers, recomputed as before."""

from __future__ import annotations

import pytest

from serve_app.engines.base import GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig

PREFILL = 2_000  # tokens/s: a 600-token prompt takes 0.3 s
STEP_S = 1 / 1_000


def _prompt(first: int) -> list[int]:
    return [200006, 1428, 200008, *range(first, first + 600), 200007]


async def _first_token(sim: SimulatedEngine, request_id: str, prompt: list[int]) -> GenerateChunk:
    request = GenerateRequest(request_id, prompt, SamplingSettings(4), session_id=request_id[0])
    chunks = [chunk async for chunk in sim.generate(request)]
    return next(chunk for chunk in chunks if chunk.token_ids)


async def _evicted_turn(**tiers: int | float) -> GenerateChunk:
    """a's prompt, then b's (the GPU holds one of them), then a's again."""
    config = SimulatedEngineConfig(
        kv_cache_tokens=16 * 38,  # one conversation: b evicts a
        prefill_tokens_per_s=PREFILL,
        decode_tokens_per_s=1_000,
        default_output_tokens=4,
        **tiers,
    )
    sim = SimulatedEngine(config)
    await sim.start()
    try:
        await _first_token(sim, "a1", _prompt(1000))
        await _first_token(sim, "b1", _prompt(5000))
        return await _first_token(sim, "a2", _prompt(1000))
    finally:
        await sim.shutdown()


async def test_without_tiers_an_evicted_prefix_is_computed_again() -> None:
    again = await _evicted_turn()
    assert again.num_cached_tokens == 0
    assert again.engine_ttft_s == pytest.approx(604 / PREFILL + STEP_S, abs=0.002)


async def test_a_prefix_in_the_cpu_tier_is_loaded_at_the_load_rate() -> None:
    again = await _evicted_turn(cpu_kv_cache_tokens=16 * 400, kv_load_tokens_per_s=20_000)
    loaded = 37 * 16  # its full blocks, the last prompt token excepted
    assert again.num_cached_tokens == loaded
    expected = loaded / 20_000 + (604 - loaded) / PREFILL + STEP_S
    assert again.engine_ttft_s == pytest.approx(expected, abs=0.002)


async def test_a_prefix_in_the_shared_tier_is_pulled_at_the_pull_rate() -> None:
    again = await _evicted_turn(
        shared_kv_cache_tokens=16 * 1000, shared_kv_pull_tokens_per_s=10_000, block_size=16
    )
    pulled = 37 * 16
    assert again.num_cached_tokens == pulled
    expected = pulled / 10_000 + (604 - pulled) / PREFILL + STEP_S
    assert again.engine_ttft_s == pytest.approx(expected, abs=0.002)
    assert again.engine_ttft_s < 604 / PREFILL / 2


def test_a_tier_smaller_than_a_block_is_refused() -> None:
    with pytest.raises(ValueError, match="cpu_kv_cache_tokens"):
        SimulatedEngineConfig(cpu_kv_cache_tokens=8)
