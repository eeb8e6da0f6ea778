"""The replay's KV tiers (loadtests/sim_tiers.py) and its `--kv-tier` option
(loadtests/sim_routing.py): an evicted prefix is loaded from the CPU tier or pulled from the
shared one instead of computed, at the rate given, and the replay runs with each tier."""

from __future__ import annotations

import subprocess
import sys

import pytest

from serve_app.engines.kv_events import BlockRemoved, BlockStored
from serve_app.engines.prefix_cache import PrefixKVCache
from serve_app.engines.simulated import SimulatedEngineConfig
from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
from bench_routing import render_turns
from sim_routing import Replay, hash_owner
from sim_tiers import CPU_MEDIUM, BlockLRU, TierConfig, TieredCache
from traces import generate

BLOCK = 16


def tiered(kind: str, shared: BlockLRU | None = None, sink: list | None = None) -> TieredCache:
    tiers = TierConfig(kind, cpu_tokens=64 * BLOCK, load_tokens_per_s=1000, pull_tokens_per_s=500)
    on_cpu = sink.extend if sink is not None else None
    return TieredCache(PrefixKVCache(BLOCK, 4 * BLOCK), tiers, shared, on_cpu)


def fill(cache: TieredCache, first: int, session: str) -> list[int]:
    """Serves a 3-block prompt (and a block of output) starting at token ``first``."""
    prompt = list(range(first, first + 3 * BLOCK + 1))
    cache.serve(prompt, [*prompt, *[0] * BLOCK], session)
    return prompt


def test_without_a_tier_an_evicted_prefix_is_computed_again() -> None:
    cache = tiered("none")
    prompt = fill(cache, 0, "a")
    fill(cache, 1000, "b")  # evicts a's blocks from the 4-block GPU cache
    served = cache.serve(prompt, prompt, "a")
    assert (served.gpu, served.loaded, served.pulled, served.transfer_s) == (0, 0, 0, 0.0)


def test_the_cpu_tier_loads_an_evicted_prefix_at_the_load_rate() -> None:
    events: list = []
    cache = tiered("cpu", sink=events)
    prompt = fill(cache, 0, "a")
    fill(cache, 1000, "b")
    assert cache.peek(prompt).loaded == 3 * BLOCK  # peek changes nothing
    served = cache.serve(prompt, prompt, "a")
    assert (served.gpu, served.loaded, served.pulled) == (0, 3 * BLOCK, 0)
    assert served.transfer_s == pytest.approx(3 * BLOCK / 1000)
    # Loaded back, it is a GPU hit the next time.
    assert cache.serve(prompt, prompt, "a").gpu == 3 * BLOCK
    stored = [event for event in events if isinstance(event, BlockStored)]
    assert {event.medium for event in stored} == {CPU_MEDIUM}
    assert {event.session_id for event in stored} == {"a", "b"}


def test_the_cpu_tier_evicts_least_recently_used_and_says_so() -> None:
    events: list = []
    cache = tiered("cpu", sink=events)
    cache.cpu = BlockLRU(5)  # room for one prompt and its output, not two
    prompt = fill(cache, 0, "a")
    fill(cache, 1000, "b")
    removed = [event for event in events if isinstance(event, BlockRemoved)]
    assert removed and all(event.medium == CPU_MEDIUM for event in removed)
    # a's deepest blocks went first: its head block is left to load, the rest is computed.
    assert cache.serve(prompt, prompt, "a").loaded == BLOCK


def test_the_shared_tier_pulls_what_another_replica_computed() -> None:
    shared = BlockLRU(1000)
    home, other = tiered("shared", shared), tiered("shared", shared)
    prompt = fill(home, 0, "a")
    served = other.serve(prompt, prompt, "a")
    assert (served.gpu, served.loaded, served.pulled) == (0, 0, 3 * BLOCK)
    assert served.transfer_s == pytest.approx(3 * BLOCK / 500)


def test_unknown_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="kv tier"):
        TierConfig.scaled("disk", 1000, 5000)


def replay(kind: str) -> tuple[float, float]:
    """Hit rate and tier share of a tiny trace under KV pressure, by hash, with ``kind``."""
    sessions = generate(12, 5.0, seed=7)
    rendered = {session.session_id: render_turns(session) for session in sessions}
    engine = SimulatedEngineConfig(prefill_tokens_per_s=5000, kv_cache_tokens=8000)
    members = ["replica-0", "replica-1"]
    tiers = TierConfig.scaled(kind, engine.kv_cache_tokens, engine.prefill_tokens_per_s)
    result = Replay(sessions, rendered, hash_owner(members), members, engine, 8, tiers=tiers).run()
    return result.hit_rate, result.tier_hits


def test_under_kv_pressure_the_tiers_keep_the_hits_a_gpu_cache_alone_loses() -> None:
    none_hits, none_tier = replay("none")
    cpu_hits, cpu_tier = replay("cpu")
    shared_hits, _ = replay("shared")
    assert none_tier == 0.0 and cpu_tier > 0.0
    assert cpu_hits > none_hits + 0.02
    assert shared_hits >= cpu_hits


def test_the_replay_command_runs_with_a_kv_tier() -> None:
    kind = "shared"
    command = [sys.executable, str(REPO / "loadtests" / "sim_routing.py"), "--seeds", "7"]
    command += ["--sessions", "6", "--replicas", "2", "--kv-cache-tokens", "8000"]
    command += ["--ttft-slack-s", "-1", "0.05", "--clairvoyant-slack-s", "0.05"]
    command += ["--ingress-replicas", "2", "--kv-tier", kind]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout
    assert "| ours, by TTFT (slack 0.05 s) |" in out
    assert "| clairvoyant moves (slack 0.05 s) |" in out
    assert f"KV tier {kind}" in out
