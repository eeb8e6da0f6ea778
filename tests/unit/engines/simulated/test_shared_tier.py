"""The simulated engine's shared KV tier as a store in another process (issue 40: on Ray each
replica is its own actor, so a per-process tier would be a store only its replica writes).
Without Ray: the store's actor body is a plain class, reached here through a stand-in with a
Ray actor handle's shape (``store.method.remote(...)`` returns an awaitable), which counts
calls and can be slowed or broken."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from serve_app.engines.base import GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.engines.prefix_cache import PrefixKVCache
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.engines.simulated.shared_tier import RemoteSharedKVTier, SharedTierStore

BLOCK = 4


class _Method:
    def __init__(self, handle: _Handle, name: str) -> None:
        self.handle, self.name = handle, name

    def remote(self, *args: Any) -> Any:
        return self.handle.call(self.name, args)


class _Handle:
    """A Ray actor handle's shape over a `SharedTierStore` in this process, one call at a
    time as a sync actor runs them."""

    def __init__(self, store: SharedTierStore) -> None:
        self.store = store
        self.calls: list[str] = []
        self.delay_s = 0.0
        self.broken = False
        self.held = _Method(self, "held")
        self.apply = _Method(self, "apply")

    async def call(self, name: str, args: tuple[Any, ...]) -> Any:
        self.calls.append(name)
        await asyncio.sleep(self.delay_s)
        if self.broken:
            raise ConnectionError("the store's actor died")
        return getattr(self.store, name)(*args)


def _replicas(count: int, capacity_tokens: int = 1024) -> tuple[_Handle, list[PrefixKVCache]]:
    handle = _Handle(SharedTierStore(capacity_tokens, BLOCK))
    caches = [
        PrefixKVCache(BLOCK, 64, shared=RemoteSharedKVTier(handle, BLOCK, flush_s=0.001))
        for _ in range(count)
    ]
    return handle, caches


async def _flush(cache: PrefixKVCache) -> None:
    tier = cache.shared
    assert isinstance(tier, RemoteSharedKVTier)
    await tier.flush()


async def test_a_prefix_one_replica_computed_is_pulled_by_another() -> None:
    handle, (home, other) = _replicas(2)
    prompt = list(range(32))  # 8 blocks
    home.insert(prompt, session_id="a")
    await _flush(home)
    await other.prefetch_shared([*prompt, 0])
    moved = other.lookup_hit([*prompt, 0], "a")
    assert (moved.tokens, moved.pulled_tokens) == (32, 32)
    # one call asked for the whole prompt: a lookup is one round trip, not one per block
    assert handle.calls.count("held") == 1


async def test_a_write_is_seen_by_the_others_a_flush_later_not_before() -> None:
    _, (home, other) = _replicas(2)
    prompt = list(range(16))
    home.insert(prompt)
    await other.prefetch_shared([*prompt, 0])
    assert other.lookup_hit([*prompt, 0]).pulled_tokens == 0  # still queued at home
    await asyncio.sleep(0.05)  # the flusher sends it on its own
    await other.prefetch_shared([*prompt, 0])
    assert other.lookup_hit([*prompt, 0]).pulled_tokens == 16


async def test_the_store_is_bounded_and_lru_across_replicas() -> None:
    handle, (writer, reader) = _replicas(2, capacity_tokens=16)  # 4 blocks
    writer.insert(list(range(16)))
    writer.insert(list(range(100, 108)))  # 2 more: the oldest 2 (the first's tail) go
    await _flush(writer)
    assert len(handle.store.tier) == 4
    await reader.prefetch_shared([*range(16), 0])
    assert reader.lookup_hit([*range(16), 0]).pulled_tokens == 8


async def test_the_lookup_asks_only_for_blocks_past_the_replicas_own_tiers() -> None:
    handle = _Handle(SharedTierStore(1024, BLOCK))
    tier = RemoteSharedKVTier(handle, BLOCK)
    cache = PrefixKVCache(BLOCK, 8, cpu_capacity_tokens=16, shared=tier)
    prompt = list(range(32))
    cache.insert(prompt)  # each keeps the head: the GPU blocks 0-1, the CPU tier 0-3
    await tier.flush()
    asked: list[list[int]] = []
    held = handle.held

    class _Spy:
        def remote(self, keys: list[int]) -> Any:
            asked.append(keys)
            return held.remote(keys)

    handle.held = _Spy()  # type: ignore[assignment]
    await cache.prefetch_shared([*prompt, 0])
    assert len(asked) == 1 and len(asked[0]) == 4  # blocks 4-7: no tier of its own holds them
    hit = cache.lookup_hit([*prompt, 0])
    assert (hit.gpu_tokens, hit.loaded_tokens, hit.pulled_tokens) == (8, 8, 16)


@pytest.mark.parametrize("failure", ["broken", "late"])
async def test_a_store_that_fails_or_is_late_is_a_miss_not_a_failure(failure: str) -> None:
    handle, (home, other) = _replicas(2)
    prompt = list(range(16))
    home.insert(prompt)
    await _flush(home)
    tier = other.shared
    assert isinstance(tier, RemoteSharedKVTier)
    tier.timeout_s = 0.05
    if failure == "broken":
        handle.broken = True
    else:
        handle.delay_s = 0.5
    await other.prefetch_shared([*prompt, 0])
    assert other.lookup_hit([*prompt, 0]).tokens == 0
    assert tier.failed_calls == 1


async def test_the_write_queue_is_bounded_dropping_the_oldest() -> None:
    handle = _Handle(SharedTierStore(1024, BLOCK))
    tier = RemoteSharedKVTier(handle, BLOCK, max_pending_keys=6)
    tier.write([1, 2, 3])
    tier.write([4, 5, 6])
    tier.write([7, 8])  # 8 keys queued: the first batch goes
    assert tier.dropped_keys == 3
    await tier.flush()
    assert handle.store.held(list(range(1, 9))) == [4, 5, 6, 7, 8]


async def _first_token(sim: SimulatedEngine, request_id: str, prompt: list[int]) -> GenerateChunk:
    request = GenerateRequest(request_id, prompt, SamplingSettings(4), session_id="a")
    chunks = [chunk async for chunk in sim.generate(request)]
    return next(chunk for chunk in chunks if chunk.token_ids)


async def test_two_engines_share_the_store_and_report_what_they_pulled() -> None:
    """Two simulated engines as on Ray: each its own view of one store."""
    config = SimulatedEngineConfig(
        prefill_tokens_per_s=2_000,
        decode_tokens_per_s=1_000,
        default_output_tokens=4,
        shared_kv_cache_tokens=16 * 1000,
        shared_kv_pull_tokens_per_s=10_000,
    )
    handle = _Handle(SharedTierStore(16 * 1000, 16))
    engines = [SimulatedEngine(config) for _ in range(2)]
    for sim in engines:
        sim.cache.shared = RemoteSharedKVTier(handle, 16)
        await sim.start()
    prompt = [200006, 1428, 200008, *range(1000, 1600), 200007]
    await _first_token(engines[0], "a1", prompt)
    await _flush(engines[0].cache)
    moved = await _first_token(engines[1], "a2", prompt)
    pulled = 37 * 16  # the full blocks, the last prompt token excepted
    assert (moved.num_cached_tokens, moved.num_pulled_tokens) == (pulled, pulled)
    assert moved.num_loaded_tokens == 0
    expected = pulled / 10_000 + (604 - pulled) / 2_000 + 1 / 1_000
    assert moved.engine_ttft_s == pytest.approx(expected, abs=0.002)


def test_a_coalesced_stream_keeps_what_the_prompt_loaded_and_pulled() -> None:
    """The deployment coalesces chunks (`GenerateChunk.merge`): the counts of the first,
    prefill's, chunk survive a later chunk that carries none."""
    first = GenerateChunk([1], num_cached_tokens=48, num_loaded_tokens=16, num_pulled_tokens=32)
    merged = first.merge(GenerateChunk([2])).merge(GenerateChunk(finish_reason="stop"))
    assert (merged.num_loaded_tokens, merged.num_pulled_tokens) == (16, 32)
