"""loadtests/bench_routing.py's tier figures: what a served turn loaded from the replica's CPU
tier or pulled from the shared one is counted from the engine's own chunks (`serve_turn`),
summed into the shares of prompt tokens (`tier_hits`) and priced at the tier's rate in work
(`work_seconds`), on the simulated engine the benchmark deploys."""

from __future__ import annotations

import sys

import pytest

from serve_app.engines.base import GenerateRequest, SamplingSettings
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.serving.engine.client import InProcessEngineClient
from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
from bench_routing import Served, Turn, serve_turn, tier_hits, work_seconds

PREFILL = 2_000  # tokens/s
HELD = 37 * 16  # an evicted 604-token prompt's full blocks, the last prompt token excepted


def _turn(conversation: str, first: int) -> Turn:
    prompt = [200006, 1428, 200008, *range(first, first + 600), 200007]
    request = GenerateRequest("", prompt, SamplingSettings(4), session_id=conversation)
    return Turn(conversation, 0, prompt, 4, conversation, request)


async def _served_again(**tiers: int | float) -> tuple[SimulatedEngineConfig, list[Served]]:
    """a's turn, b's (which evicts a from the GPU), a's again: as the benchmark serves them."""
    config = SimulatedEngineConfig(
        kv_cache_tokens=16 * 38,
        prefill_tokens_per_s=PREFILL,
        decode_tokens_per_s=1_000,
        default_output_tokens=4,
        **tiers,
    )
    engine = SimulatedEngine(config)
    await engine.start()
    try:
        client = InProcessEngineClient(engine)
        served = [
            await serve_turn(client, turn)  # type: ignore[arg-type]
            for turn in (_turn("a", 1000), _turn("b", 5000), _turn("a", 1000))
        ]
    finally:
        await engine.shutdown()
    return config, served


async def test_a_prefix_loaded_from_the_cpu_tier_is_counted_and_priced_at_the_load_rate() -> None:
    config, served = await _served_again(cpu_kv_cache_tokens=16 * 400, kv_load_tokens_per_s=20_000)
    assert [s.loaded_tokens for s in served] == [0, 0, HELD]
    assert [s.pulled_tokens for s in served] == [0, 0, 0]
    assert served[2].cached_tokens == HELD
    prompt = sum(s.prompt_tokens for s in served)
    assert tier_hits(served) == (pytest.approx(HELD / prompt), 0.0)
    again = served[2]
    assert work_seconds(config)(again) == pytest.approx(
        (604 - HELD) / PREFILL + HELD / 20_000 + again.output_tokens / 1_000
    )


async def test_a_prefix_pulled_from_the_shared_tier_is_counted_and_priced_at_the_pull_rate() -> (
    None
):
    config, served = await _served_again(
        # A size of its own: the process keeps one shared tier per size (other tests have theirs).
        shared_kv_cache_tokens=16 * 1013,
        shared_kv_pull_tokens_per_s=10_000,
    )
    assert [s.pulled_tokens for s in served] == [0, 0, HELD]
    assert [s.loaded_tokens for s in served] == [0, 0, 0]
    prompt = sum(s.prompt_tokens for s in served)
    assert tier_hits(served) == (0.0, pytest.approx(HELD / prompt))
    again = served[2]
    assert work_seconds(config)(again) == pytest.approx(
        (604 - HELD) / PREFILL + HELD / 10_000 + again.output_tokens / 1_000
    )


async def test_without_a_tier_nothing_is_loaded_or_pulled_and_the_prefix_is_computed() -> None:
    config, served = await _served_again()
    assert tier_hits(served) == (0.0, 0.0)
    again = served[2]
    assert again.cached_tokens == 0
    assert work_seconds(config)(again) == pytest.approx(604 / PREFILL + again.output_tokens / 1_000)
