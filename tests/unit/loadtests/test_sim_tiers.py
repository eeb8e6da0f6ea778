"""The replay's KV tiers (loadtests/sim_tiers.py) and its `--kv-tier` option
(loadtests/sim_routing.py): an evicted prefix is loaded from the CPU tier or pulled from the
shared one instead of computed, at the rate given, and the replay runs with each tier."""

from __future__ import annotations

import subprocess
import sys

import pytest

from serve_app.engines.kv_events import BlockRemoved, BlockStored
from serve_app.engines.prefix_cache import CPU_MEDIUM, PrefixKVCache, SharedKVTier
from serve_app.engines.simulated import SimulatedEngineConfig
from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
from bench_routing import render_turns
from sim_routing import Replay, hash_owner
from sim_tiers import TierConfig, peek, serve, tiered_cache
from traces import generate

BLOCK = 16
TIERS = {
    kind: TierConfig(kind, cpu_tokens=64 * BLOCK, load_tokens_per_s=1000, pull_tokens_per_s=500)
    for kind in ("none", "cpu", "shared")
}


def cache(
    kind: str, shared: SharedKVTier | None = None, events: list | None = None
) -> PrefixKVCache:
    sink = events.extend if events is not None else None
    return tiered_cache(BLOCK, 4 * BLOCK, TIERS[kind], shared, sink)


def fill(replica: PrefixKVCache, kind: str, first: int, session: str) -> list[int]:
    """Serves a 3-block prompt (and a block of output) starting at token ``first``."""
    prompt = list(range(first, first + 3 * BLOCK + 1))
    serve(replica, TIERS[kind], prompt, [*prompt, *[0] * BLOCK], session)
    return prompt


def test_without_a_tier_an_evicted_prefix_is_computed_again() -> None:
    replica = cache("none")
    prompt = fill(replica, "none", 0, "a")
    fill(replica, "none", 1000, "b")  # evicts a's blocks from the 4-block GPU cache
    served = serve(replica, TIERS["none"], prompt, prompt, "a")
    assert (served.gpu, served.loaded, served.pulled, served.transfer_s) == (0, 0, 0, 0.0)


def test_the_cpu_tier_loads_an_evicted_prefix_at_the_load_rate() -> None:
    events: list = []
    replica = cache("cpu", events=events)
    prompt = fill(replica, "cpu", 0, "a")
    fill(replica, "cpu", 1000, "b")
    assert peek(replica, TIERS["cpu"], prompt).loaded == 3 * BLOCK  # peek changes nothing
    served = serve(replica, TIERS["cpu"], prompt, prompt, "a")
    assert (served.gpu, served.loaded, served.pulled) == (0, 3 * BLOCK, 0)
    assert served.transfer_s == pytest.approx(3 * BLOCK / 1000)
    # Loaded back, it is a GPU hit the next time.
    assert serve(replica, TIERS["cpu"], prompt, prompt, "a").gpu == 3 * BLOCK
    on_cpu = [event for event in events if getattr(event, "medium", None) == CPU_MEDIUM]
    assert any(isinstance(event, BlockStored) for event in on_cpu)


def test_a_small_cpu_tier_evicts_a_prefix_from_its_end_and_says_so() -> None:
    events: list = []
    tiers = TierConfig("cpu", cpu_tokens=5 * BLOCK, load_tokens_per_s=1000, pull_tokens_per_s=1)
    replica = tiered_cache(BLOCK, 4 * BLOCK, tiers, None, events.extend)
    prompt = list(range(3 * BLOCK + 1))
    serve(replica, tiers, prompt, [*prompt, *[0] * BLOCK], "a")
    other = list(range(1000, 1000 + 3 * BLOCK + 1))
    serve(replica, tiers, other, [*other, *[0] * BLOCK], "b")
    removed = [event for event in events if isinstance(event, BlockRemoved)]
    assert any(event.medium == CPU_MEDIUM for event in removed)
    # a's deepest blocks went first: its head block is left to load, the rest is computed.
    assert serve(replica, tiers, prompt, prompt, "a").loaded == BLOCK


def test_the_shared_tier_pulls_what_another_replica_computed() -> None:
    shared = SharedKVTier(1000 * BLOCK, BLOCK)
    home, other = cache("shared", shared), cache("shared", shared)
    prompt = fill(home, "shared", 0, "a")
    served = serve(other, TIERS["shared"], prompt, prompt, "a")
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
