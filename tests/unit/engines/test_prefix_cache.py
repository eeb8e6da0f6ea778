"""The block-level prefix KV cache model (what vLLM's automatic prefix caching would reuse)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence

import pytest

from serve_app.engines.kv_events import BlockRemoved, BlockStored, KVEvent
from serve_app.engines.prefix_cache import PrefixKVCache, SharedKVTier


def test_hits_grow_as_a_conversation_shares_a_longer_prefix() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=1024)
    conversation = list(range(10))
    hits = []
    for turn in range(4):
        hits.append(cache.lookup(conversation))
        conversation = [*conversation, *range(100 * (turn + 1), 100 * (turn + 1) + 7)]
        cache.insert(conversation[:-3])  # this turn's prompt + output: a prefix of the next
    assert hits == [0, 12, 20, 28]
    assert hits == sorted(hits)


def test_only_full_blocks_are_cached() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=64)
    cache.insert(list(range(10)))  # two full blocks; the partial third is not cached
    assert cache.used_blocks == 2
    assert cache.lookup([*range(10), 50, 51, 52]) == 8
    assert cache.lookup([*range(8), 99, 98, 97]) == 8


def test_a_different_block_breaks_the_chain() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=64)
    cache.insert(list(range(12)))
    # Same second and third blocks after a different first one: nothing is reusable.
    assert cache.lookup([7, 1, 2, 3, *range(4, 12), 0]) == 0
    # A difference in the second block keeps the first.
    assert cache.lookup([0, 1, 2, 3, 4, 5, 6, 99, *range(8, 12), 0]) == 4


def test_never_the_whole_prompt() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=64)
    cache.insert(list(range(8)))
    # The last prompt token is always computed, so its block cannot come from cache.
    assert cache.lookup(list(range(8))) == 4
    assert cache.lookup(list(range(9))) == 8
    assert cache.lookup([0]) == 0
    assert cache.lookup([]) == 0


def test_lru_eviction_keeps_the_recently_used_prefix() -> None:
    cache = PrefixKVCache(block_size=2, capacity_tokens=8)  # four blocks
    cache.insert([1, 2, 3, 4])
    cache.insert([5, 6, 7, 8])
    cache.lookup([1, 2, 3, 4, 0])  # touch the first sequence
    cache.insert([9, 10, 11, 12])  # evicts the second sequence
    assert cache.used_blocks == 4
    assert cache.lookup([1, 2, 3, 4, 0]) == 4
    assert cache.lookup([5, 6, 7, 8, 0]) == 0
    assert cache.lookup([9, 10, 11, 12, 0]) == 4
    assert cache.stats().evicted_blocks == 2


def test_eviction_takes_a_sequence_tail_first() -> None:
    cache = PrefixKVCache(block_size=2, capacity_tokens=8)
    cache.insert([1, 2, 3, 4, 5, 6])  # three blocks
    cache.insert([7, 8, 9, 10])  # two more: one must go, the LRU sequence's deepest block
    assert cache.lookup([1, 2, 3, 4, 5, 6, 0]) == 4
    assert cache.lookup([7, 8, 9, 10, 0]) == 4


def test_a_sequence_longer_than_the_cache_keeps_its_head() -> None:
    cache = PrefixKVCache(block_size=2, capacity_tokens=4)
    cache.insert(list(range(10)))
    assert cache.used_blocks == 2
    assert cache.lookup(list(range(11))) == 4


def test_stats_count_tokens_and_blocks() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=64)
    cache.lookup(list(range(10)))
    cache.insert(list(range(10)))
    cache.lookup(list(range(10)))
    stats = cache.stats()
    assert (stats.lookups, stats.queried_tokens, stats.hit_tokens) == (2, 20, 8)
    assert stats.hit_rate == pytest.approx(0.4)
    assert (stats.used_blocks, stats.capacity_blocks, stats.inserted_blocks) == (2, 16, 2)
    assert stats.usage == pytest.approx(2 / 16)


def test_peek_changes_neither_stats_nor_lru() -> None:
    cache = PrefixKVCache(block_size=2, capacity_tokens=4)
    cache.insert([1, 2])
    cache.insert([3, 4])
    assert cache.peek([1, 2, 0]) == 2  # must not make [1, 2] recent
    cache.insert([5, 6])
    assert cache.peek([1, 2, 0]) == 0
    assert cache.stats().lookups == 0


def test_known_keys_hash_only_the_new_blocks_and_agree_with_a_full_insert() -> None:
    prompt, output = list(range(37)), list(range(500, 530))
    incremental = PrefixKVCache(block_size=4, capacity_tokens=1024)
    keys = incremental.insert(prompt)
    incremental.insert([*prompt, *output], keys)
    full = PrefixKVCache(block_size=4, capacity_tokens=1024)
    full.insert([*prompt, *output])
    assert incremental.block_keys([*prompt, *output]) == full.block_keys([*prompt, *output])
    assert incremental.used_blocks == full.used_blocks == (37 + 30) // 4
    assert incremental.lookup([*prompt, *output, 1]) == full.lookup([*prompt, *output, 1]) == 64


def test_invalid_sizes_are_rejected() -> None:
    with pytest.raises(ValueError):
        PrefixKVCache(block_size=0)
    with pytest.raises(ValueError):
        PrefixKVCache(block_size=16, capacity_tokens=8)
    cache = PrefixKVCache(block_size=4, capacity_tokens=64)
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3, 4], known_keys=[1, 2])


def test_clear_drops_blocks() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=64)
    cache.insert(list(range(16)))
    cache.clear()
    assert cache.used_blocks == 0
    assert cache.lookup(list(range(17))) == 0


def test_lookup_blocks_returns_the_hit_keys_for_insert() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=64)
    cache.insert(list(range(8)))
    prompt = [*range(8), 20, 21, 22, 23, 24]
    hits = cache.lookup_blocks(prompt)
    assert hits == cache.block_keys(prompt)[:2]
    assert cache.insert(prompt, hits) == cache.block_keys(prompt)
    assert cache.stats().hit_tokens == 8


def test_a_salted_prompt_hits_only_blocks_cached_under_its_salt() -> None:
    """vLLM's ``cache_salt``: in the first block's hash, so in every key chained from it."""
    cache = PrefixKVCache(block_size=4, capacity_tokens=1024)
    prompt = list(range(13))  # three full blocks within the first 12 tokens
    cache.insert(prompt, salt="tenant-a")
    assert cache.lookup(prompt, salt="tenant-b") == 0
    assert cache.lookup(prompt) == 0  # unsalted: a namespace of its own
    assert cache.lookup(prompt, salt="tenant-a") == 12
    cache.insert(prompt)
    assert cache.lookup(prompt) == 12
    assert cache.lookup(prompt, salt="tenant-b") == 0
    assert cache.stats().used_blocks == 6  # the same tokens, cached once per namespace


def test_the_salt_changes_every_block_key_and_a_grown_sequence_keeps_it() -> None:
    cache = PrefixKVCache(block_size=4, capacity_tokens=1024)
    prompt, output = list(range(8)), list(range(50, 58))
    salted, other = cache.block_keys(prompt, "a"), cache.block_keys(prompt, "b")
    assert not set(salted) & set(other) and not set(salted) & set(cache.block_keys(prompt))
    # A prompt's keys (from its lookup) extend to its output under the salt they were made with.
    hits = cache.lookup_blocks([*prompt, 1], salt="a")
    keys = cache.insert(prompt, hits, salt="a")
    assert cache.insert([*prompt, *output], keys, salt="a") == cache.block_keys(
        [*prompt, *output], "a"
    )
    assert cache.lookup([*prompt, *output, 1], salt="a") == 16
    assert cache.peek([*prompt, *output, 1], salt="b") == 0


# --- tiers behind the GPU cache (issue 40) ------------------------------------------------------


def _recorder() -> tuple[list[KVEvent], Callable[[Sequence[KVEvent]], None]]:
    events: list[KVEvent] = []
    return events, events.extend


def test_without_tiers_a_lookup_finds_only_gpu_blocks_and_publishes_no_cpu_event() -> None:
    events, sink = _recorder()
    cache = PrefixKVCache(block_size=4, capacity_tokens=16, on_events=sink)
    cache.insert(list(range(16)), session_id="a")
    cache.insert(list(range(100, 116)), session_id="b")  # a's blocks are evicted: gone
    hit = cache.lookup_hit([*range(16), 0], "a")
    assert (hit.tokens, hit.loaded_tokens, hit.pulled_tokens) == (0, 0, 0)
    assert all(getattr(event, "medium", None) is None for event in events)


def test_a_prefix_the_gpu_evicted_is_loaded_from_the_cpu_tier_and_is_a_gpu_block_again() -> None:
    events, sink = _recorder()
    cache = PrefixKVCache(block_size=4, capacity_tokens=16, on_events=sink, cpu_capacity_tokens=64)
    a = list(range(16))
    keys = cache.insert(a, session_id="a")
    # vLLM's connector writes computed blocks out as they are computed: no session, medium CPU
    assert events == [
        BlockStored(tuple(keys), None, 4, "a"),
        BlockStored(tuple(keys), None, 4, medium="CPU"),
    ]
    cache.insert(list(range(100, 116)), session_id="b")  # the GPU evicts a; its copy stays
    assert cache.peek([*a, 0]) == 0
    events.clear()
    hit = cache.lookup_hit([*a, 0], "a")
    assert (hit.tokens, hit.loaded_tokens, hit.gpu_tokens) == (16, 16, 0)
    assert events == []  # no GPU block was hit: nothing to report for the lookup
    cache.insert([*a, 0], hit.keys, "a")  # loaded into the GPU: stored there again
    assert events[0] == BlockStored(tuple(keys), None, 4, "a")
    assert cache.peek([*a, 0]) == 16
    stats = cache.stats()
    assert (stats.hit_tokens, stats.loaded_tokens, stats.cpu_used_blocks) == (16, 16, 8)


def test_the_cpu_tier_is_lru_and_publishes_what_it_evicts() -> None:
    events, sink = _recorder()
    cache = PrefixKVCache(block_size=4, capacity_tokens=8, on_events=sink, cpu_capacity_tokens=16)
    first = cache.insert(list(range(16)), session_id="a")  # 4 blocks: the CPU tier is full
    events.clear()
    cache.insert(list(range(100, 108)), session_id="b")  # 2 more: a's 2 deepest go
    assert BlockRemoved(tuple(first[2:][::-1]), medium="CPU") in events
    hit = cache.lookup_hit([*range(16), 0])
    assert hit.tokens == 8  # a's head is still in the CPU tier, its tail is gone
    assert cache.stats().cpu_used_blocks == 4


def test_the_chain_goes_gpu_then_cpu_then_shared_each_block_from_the_cheapest_tier() -> None:
    shared = SharedKVTier(capacity_tokens=1024, block_size=4)
    home = PrefixKVCache(block_size=4, capacity_tokens=8, cpu_capacity_tokens=16, shared=shared)
    other = PrefixKVCache(block_size=4, capacity_tokens=64, shared=shared)
    prompt = list(range(32))  # 8 blocks: the GPU keeps 2, the CPU tier 4, the shared tier all
    home.insert(prompt, session_id="a")  # each tier keeps the head (evicts the deepest first)
    hit = home.lookup_hit([*prompt, 0])
    assert (hit.gpu_tokens, hit.loaded_tokens, hit.pulled_tokens) == (8, 8, 16)
    # another replica finds every block in the shared tier: pulled, not computed
    moved = other.lookup_hit([*prompt, 0], "a")
    assert (moved.tokens, moved.pulled_tokens) == (32, 32)
    assert other.stats().pulled_tokens == 32


def test_the_shared_tier_is_bounded_and_lru() -> None:
    shared = SharedKVTier(capacity_tokens=16, block_size=4)
    writer = PrefixKVCache(block_size=4, capacity_tokens=64, shared=shared)
    reader = PrefixKVCache(block_size=4, capacity_tokens=64, shared=shared)
    writer.insert(list(range(16)))
    writer.insert(list(range(100, 108)))  # 2 more blocks: the oldest 2 (a's tail) go
    assert len(shared) == 4
    assert reader.peek_hit([*range(16), 0]).pulled_tokens == 8
    with pytest.raises(ValueError, match="block_size"):
        PrefixKVCache(block_size=8, capacity_tokens=64, shared=shared)


def _keys_in_a_process(hash_seed: str) -> str:
    code = (
        "from serve_app.engines.prefix_cache import PrefixKVCache as C; "
        "print(C(4).block_keys(list(range(12))), C(4).block_keys(list(range(12)), salt='t'))"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_block_keys_are_the_same_in_every_process() -> None:
    """Replicas on Ray share a tier by block key: Python's per-process str-hash salt (the
    root's, a cache salt's) must not reach the keys."""
    assert _keys_in_a_process("1") == _keys_in_a_process("2")
