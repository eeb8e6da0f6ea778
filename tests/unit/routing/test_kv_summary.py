"""The KV summary (routing/kv_summary.py) on the real prefix-cache model's events, and on
vLLM-shaped events with KV-cache groups: what an engine replica reports it holds."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from serve_app.engines.kv_events import BlockRemoved, BlockStored, EventsLost
from serve_app.engines.prefix_cache import PrefixKVCache
from serve_app.routing.kv_summary import HeldPrefixes
from serve_app.routing.ring import stable_hash

SHARED = list(range(1000, 1032))  # two blocks every conversation starts with


def _prompt(conversation: int, blocks: int) -> list[int]:
    return [*SHARED, *(conversation * 10_000 + token for token in range(16 * blocks))]


def _serve(cache: PrefixKVCache, prompt: list[int], session: str) -> None:
    """As the simulated engine serves a request: look up (hits reported), then insert."""
    hits = cache.lookup_blocks([*prompt, 7], session)
    cache.insert(prompt, hits, session)


def test_the_summary_counts_each_conversations_cached_blocks_from_the_cache_events() -> None:
    held = HeldPrefixes()
    cache = PrefixKVCache(block_size=16, capacity_tokens=16 * 100, on_events=held)
    cache.insert(_prompt(1, 3), session_id="a")
    # b finds the shared head cached (a BlockStored for the hit, as vLLM sends) and adds its own
    hits = cache.lookup_blocks([*_prompt(2, 4), 7], "b")
    cache.insert(_prompt(2, 4), hits, "b")
    assert held.held_tokens("a") == 16 * 5
    assert held.held_tokens("b") == 16 * 6
    assert held.held_tokens("c") == 0
    assert held.report() == {stable_hash("a"): 80, stable_hash("b"): 96}
    assert held.event_counts == {"BlockStored": 3}


def test_evicted_blocks_leave_the_conversations_that_held_them() -> None:
    held = HeldPrefixes()
    cache = PrefixKVCache(block_size=16, capacity_tokens=16 * 8, on_events=held)
    _serve(cache, _prompt(1, 4), "a")  # 6 blocks
    _serve(cache, _prompt(2, 4), "b")  # 4 new: a's 2 deepest blocks are evicted
    assert held.held_tokens("a") == 16 * 4
    assert held.held_tokens("b") == 16 * 6
    _serve(cache, _prompt(3, 6), "c")  # 6 new: b's and a's tails go
    assert held.held_tokens("c") == 16 * 8
    assert held.held_tokens("a") + held.held_tokens("b") == 16 * 4  # the shared head, each
    assert held.event_counts == {"BlockStored": 5, "BlockRemoved": 2}
    cache.clear()
    assert held.held_tokens("c") == 0
    assert held.report() == {}
    assert held.event_counts["AllBlocksCleared"] == 1


def test_only_the_first_full_attention_group_is_counted() -> None:
    """gpt-oss on vLLM has a sliding-window and a full-attention group, each with its events."""
    held = HeldPrefixes()
    window = BlockStored((1, 2), None, 16, "a", group_idx=0, kv_cache_spec_kind="sliding_window")
    full = BlockStored((3, 4, 5), None, 16, "a", group_idx=1, kv_cache_spec_kind="full_attention")
    held([window, full, BlockRemoved((1, 2), group_idx=0)])
    assert held.held_tokens("a") == 48
    held([BlockRemoved((5,), group_idx=1)])
    assert held.held_tokens("a") == 32


def test_lost_events_make_the_summary_start_over_and_resync_from_the_next_turns() -> None:
    """A lost batch may have removed blocks: nothing held before it is reported after it, and
    a conversation's next turn re-reports its prefix hit, as vLLM's "full" report mode does."""
    held = HeldPrefixes()
    cache = PrefixKVCache(block_size=16, capacity_tokens=16 * 100, on_events=held)
    _serve(cache, _prompt(1, 3), "a")
    _serve(cache, _prompt(2, 3), "b")
    held([EventsLost(4)])
    assert held.report() == {}
    assert held.held_tokens("a") == held.held_tokens("b") == 0
    assert held.event_counts["EventsLost"] == 1
    _serve(cache, _prompt(1, 4), "a")  # a's next turn: its 5 cached blocks, then 1 new
    assert held.report() == {stable_hash("a"): 16 * 6}


def test_two_tenants_prompts_are_held_apart_under_their_cache_salts() -> None:
    """The same prompt under two salts is two sets of blocks: each tenant's conversation is
    credited with its own, and evicting one tenant's leaves the other's counted."""
    held = HeldPrefixes()
    cache = PrefixKVCache(block_size=16, capacity_tokens=16 * 8, on_events=held)
    prompt = _prompt(1, 2)  # 4 blocks
    for session, salt in (("owner-a:conv", "a"), ("owner-b:conv", "b")):
        hits = cache.lookup_blocks([*prompt, 7], session, salt)
        assert hits == []  # the other tenant's blocks are no hit
        cache.insert(prompt, hits, session, salt)
    assert held.held_tokens("owner-a:conv") == held.held_tokens("owner-b:conv") == 16 * 4
    assert held.event_counts == {"BlockStored": 2}  # no prefix hit was reported
    hits = cache.lookup_blocks([*prompt, 7], "owner-b:conv", "b")  # b's repeat hits its own
    cache.insert([*prompt, *range(64)], hits, "owner-b:conv", "b")  # 4 more: a's go
    assert held.held_tokens("owner-a:conv") == 0
    assert held.held_tokens("owner-b:conv") == 16 * 8


def test_the_summary_keeps_only_the_most_recently_stored_conversations() -> None:
    """Every conversation starts with the same two blocks, which stay cached: the summary
    still forgets all but the ``max_reported`` conversations stored most recently (what it
    reports), rather than keep every one that ever touched the shared head. A forgotten
    conversation is known again from its next turn, which reports its prefix hit."""
    held = HeldPrefixes(max_reported=3)
    cache = PrefixKVCache(block_size=16, capacity_tokens=16 * 1000, on_events=held)
    for conversation in range(1, 101):
        _serve(cache, _prompt(conversation, 1), f"c{conversation}")
    assert cache.peek([*_prompt(1, 1), 7]) == 48  # c1's blocks are all still cached
    assert held.held_tokens("c1") == 0
    assert len(held) == 3
    assert held.report() == {stable_hash(f"c{c}"): 48 for c in (98, 99, 100)}
    _serve(cache, _prompt(1, 1), "c1")
    assert held.held_tokens("c1") == 48
    assert held.held_tokens("c98") == 0  # the least recently stored made room
    assert list(held.report()) == [stable_hash(f"c{c}") for c in (99, 100, 1)]


@pytest.mark.parametrize("seed", range(20))
def test_the_bounded_summary_never_claims_a_block_that_is_gone(seed: int) -> None:
    """Random stores (of shared and own blocks) and removals: the summary holds at most its
    bound, only blocks still cached, and the conversation that stored last with everything its
    last store named."""
    rng = random.Random(seed)
    held = HeldPrefixes(max_reported=4)
    cached: set[int] = set()
    for _ in range(400):
        if rng.random() < 0.7:
            session = f"c{rng.randrange(12)}"
            blocks = tuple(rng.sample(range(30), rng.randint(1, 4)))
            held([BlockStored(blocks, None, 16, session)])
            cached.update(blocks)
            assert held.held_tokens(session) >= 16 * len(blocks)
        else:
            gone = tuple(rng.sample(sorted(cached), min(len(cached), rng.randint(1, 3))))
            held([BlockRemoved(gone)])
            cached.difference_update(gone)
        assert len(held) <= 4 and len(held.report()) == len(held)
        assert all(tokens <= 16 * len(cached) for tokens in held.report().values())
        for conversation in held._held.values():  # the summary's own sets
            assert conversation <= cached


# --- by medium: a CPU tier behind the GPU cache (issue 40) -------------------------------------


def _cpu_stored(*blocks: int) -> BlockStored:
    """As vLLM's offloading connector announces a write to its CPU tier: no session."""
    return BlockStored(blocks, None, 16, medium="CPU")


def test_a_block_on_gpu_and_cpu_counts_on_the_gpu_and_its_cpu_copy_outlives_the_gpu_one() -> None:
    held = HeldPrefixes()
    held([BlockStored((1, 2, 3), None, 16, "a"), _cpu_stored(1, 2, 3)])
    assert (held.held_tokens("a"), held.cpu_held_tokens("a")) == (48, 0)
    assert held.cpu_report() == {}
    held([BlockRemoved((2, 3))])  # the GPU evicts the tail: its CPU copies stay
    assert (held.held_tokens("a"), held.cpu_held_tokens("a")) == (16, 32)
    assert held.report() == {stable_hash("a"): 16}
    assert held.cpu_report() == {stable_hash("a"): 32}
    held([BlockRemoved((1,), medium="GPU")])  # all gone from the GPU: still held, on CPU
    assert held.report() == {} and held.cpu_report() == {stable_hash("a"): 48}
    assert len(held) == 1
    held([BlockRemoved((1, 2, 3), medium="CPU")])
    assert len(held) == 0 and held.cpu_report() == {}


def test_a_cpu_removal_never_removes_the_gpu_copy() -> None:
    held = HeldPrefixes()
    held([BlockStored((1, 2), None, 16, "a"), _cpu_stored(1, 2)])
    held([BlockRemoved((1, 2), medium="CPU")])
    assert (held.held_tokens("a"), held.cpu_held_tokens("a")) == (32, 0)
    held([_cpu_stored(1, 2), BlockRemoved((1, 2), medium="STORAGE")])  # a medium not counted
    held([BlockRemoved((1, 2))])
    assert (held.held_tokens("a"), held.cpu_held_tokens("a")) == (0, 32)


def test_cpu_copies_are_counted_per_announcement_as_vllms_connector_asks() -> None:
    """A block in two offloaded chunks is announced twice and removed twice."""
    held = HeldPrefixes()
    held([BlockStored((1, 2), None, 16, "a"), _cpu_stored(1, 2), _cpu_stored(2)])
    held([BlockRemoved((1, 2))])
    held([BlockRemoved((1, 2), medium="CPU")])
    assert held.cpu_held_tokens("a") == 16  # block 2's other announcement stands
    held([BlockRemoved((2,), medium="CPU")])
    assert held.cpu_held_tokens("a") == 0 and len(held) == 0


def test_a_conversation_finding_a_block_the_cpu_tier_holds_gets_its_copy_too() -> None:
    """b's turn hits a's shared head on the GPU after it was written out: when the GPU evicts
    it, both conversations still have it on CPU."""
    held = HeldPrefixes()
    held([BlockStored((1,), None, 16, "a"), _cpu_stored(1), BlockStored((1, 5), None, 16, "b")])
    held([BlockRemoved((1,))])
    assert held.cpu_held_tokens("a") == held.cpu_held_tokens("b") == 16
    assert held.held_tokens("b") == 16


def test_the_cache_models_cpu_tier_events_give_the_conversation_its_cpu_held_tokens() -> None:
    """The simulated engine's cache with a CPU tier: a conversation the GPU evicts is
    reported held on CPU (a turn loads it), with the same keys and bound as held_tokens."""
    held = HeldPrefixes(max_reported=2)
    cache = PrefixKVCache(16, 16 * 8, on_events=held, cpu_capacity_tokens=16 * 100)
    _serve(cache, _prompt(1, 4), "a")  # 6 blocks
    _serve(cache, _prompt(2, 6), "b")  # 6 new: a keeps only the shared head on the GPU
    assert held.held_tokens("a") == 32 and held.cpu_held_tokens("a") == 64
    assert held.cpu_report() == {stable_hash("a"): 64}
    _serve(cache, _prompt(3, 1), "c")  # a is the least recently stored: forgotten
    assert held.cpu_held_tokens("a") == 0 and stable_hash("a") not in held.cpu_report()
    assert len(held) == 2
    cache.clear()
    assert held.cpu_report() == {} and held.report() == {}


@pytest.mark.parametrize("seed", range(20))
def test_the_summary_by_medium_never_claims_a_copy_that_is_gone(seed: int) -> None:
    """Random GPU and CPU stores and removals: a conversation's GPU blocks are still on the
    GPU, its CPU-only blocks still in the CPU tier, within the bound."""
    rng = random.Random(seed)
    held = HeldPrefixes(max_reported=4)
    on_gpu: set[int] = set()
    on_cpu: Counter[int] = Counter()
    for _ in range(400):
        roll = rng.random()
        blocks = tuple(rng.sample(range(30), rng.randint(1, 4)))
        if roll < 0.4:
            held([BlockStored(blocks, None, 16, f"c{rng.randrange(12)}")])
            on_gpu.update(blocks)
        elif roll < 0.6:
            held([_cpu_stored(*blocks)])
            on_cpu.update(blocks)
        elif roll < 0.8:
            gone = tuple(block for block in blocks if block in on_gpu)
            held([BlockRemoved(gone)])
            on_gpu.difference_update(gone)
        else:
            gone = tuple(block for block in blocks if on_cpu[block])
            held([BlockRemoved(gone, medium="CPU")])
            on_cpu.subtract(gone)
        assert len(held) <= 4
        for conversation, blocks_held in held._held.items():
            assert blocks_held <= on_gpu
            cpu_only = held._cpu.get(conversation, set()) - blocks_held
            assert all(on_cpu[block] > 0 for block in cpu_only)
            assert blocks_held or cpu_only  # nothing held: forgotten


@pytest.mark.parametrize("seed", range(10))
def test_the_summary_of_the_cache_models_tiers_matches_what_each_tier_holds(seed: int) -> None:
    """Random turns of a dozen conversations on a cache with a small GPU and a CPU tier:
    what the summary counts on the GPU is on the GPU, what it counts on CPU only is in the CPU
    tier, and the conversation just served is held whole across the two."""
    rng = random.Random(seed)
    held = HeldPrefixes(max_reported=6)
    cache = PrefixKVCache(16, 16 * 24, on_events=held, cpu_capacity_tokens=16 * 60)
    turns = [0] * 12
    for _ in range(150):
        conversation = rng.randrange(12)
        turns[conversation] += 1
        prompt = _prompt(conversation + 1, turns[conversation])
        _serve(cache, prompt, f"c{conversation}")
        whole = held.held_tokens(f"c{conversation}") + held.cpu_held_tokens(f"c{conversation}")
        assert whole == len(prompt) // 16 * 16
        for key, gpu_blocks in held._held.items():
            assert all(block in cache._blocks for block in gpu_blocks)
            cpu_only = held._cpu.get(key, set()) - gpu_blocks
            assert all(block in cache._cpu for block in cpu_only)
