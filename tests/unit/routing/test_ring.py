"""Consistent hashing with bounded loads: determinism, the bound, and remapping on scale."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from serve_app.routing.ring import HashRing, choose_bounded, load_bound

REPLICAS = [f"replica-{index}" for index in range(8)]
KEYS = [f"conversation-{index}" for index in range(5000)]


def owners(ring: HashRing) -> dict[str, str]:
    return {key: ring.owner(key) for key in KEYS}


def test_owner_is_deterministic_across_rings_and_member_order() -> None:
    first = owners(HashRing(REPLICAS))
    second = owners(HashRing(reversed(REPLICAS)))
    assert first == second
    assert set(first.values()) == set(REPLICAS)


def test_keys_spread_about_evenly() -> None:
    counts = Counter(owners(HashRing(REPLICAS)).values())
    mean = len(KEYS) / len(REPLICAS)
    assert max(counts.values()) < 1.3 * mean
    assert min(counts.values()) > 0.7 * mean


@pytest.mark.parametrize("change", ["add", "remove"])
def test_scaling_by_one_moves_about_one_nth_of_keys_and_no_others(change: str) -> None:
    before = HashRing(REPLICAS)
    members = [*REPLICAS, "replica-new"] if change == "add" else REPLICAS[:-1]
    after = HashRing(members)
    old, new = owners(before), owners(after)
    moved = [key for key in KEYS if old[key] != new[key]]
    share = len(moved) / len(KEYS)
    expected = 1 / 9 if change == "add" else 1 / 8
    assert 0.6 * expected < share < 1.4 * expected
    for key in moved:  # only keys of the added or removed replica move
        assert new[key] == "replica-new" if change == "add" else old[key] == "replica-7"


def test_owner_wins_while_under_the_bound() -> None:
    ring = HashRing(REPLICAS)
    loads = {replica: 3 for replica in REPLICAS}
    for key in KEYS[:200]:
        choice = choose_bounded(ring, key, loads)
        assert choice.replica == ring.owner(key) and not choice.spilled


def test_an_overloaded_owner_spills_to_the_next_replica_on_the_ring() -> None:
    ring = HashRing(REPLICAS)
    key = KEYS[0]
    walk = list(ring.walk(key))
    loads = {replica: 2 for replica in REPLICAS}
    loads[walk[0]] = 10
    choice = choose_bounded(ring, key, loads, load_factor=1.25, min_bound=0)
    assert choice.spilled and choice.replica == walk[1]


def test_the_bound_is_c_times_the_mean_not_rounded_up() -> None:
    loads = {replica: 3 for replica in REPLICAS[:5]}  # 15 in flight, 16 with the new one
    assert load_bound(loads, REPLICAS, 1.25, min_bound=0) == 2.5  # a replica may hold 2
    assert load_bound({}, REPLICAS, 1.25, min_bound=0) == 1  # the mean rounded up: room


def test_at_low_load_the_owner_keeps_its_keys_up_to_the_floor() -> None:
    """A few requests in flight: c x mean is tiny, the floor keeps the conversation home."""
    ring = HashRing(REPLICAS)
    key = KEYS[0]
    owner = ring.owner(key)
    loads = {owner: 3}  # 3 in flight over 8 replicas: c x mean alone would allow 1
    assert load_bound(loads, REPLICAS, 1.25, min_bound=0) == 1
    assert choose_bounded(ring, key, loads, min_bound=0).spilled
    choice = choose_bounded(ring, key, loads, min_bound=4)
    assert choice.replica == owner and not choice.spilled
    loads[owner] = 4  # the floor is reached: the next one spills
    assert choose_bounded(ring, key, loads, min_bound=4).spilled


def test_the_bound_holds_for_hot_keys() -> None:
    """Many requests of a few conversations at once never push a replica past c x mean."""
    ring = HashRing(REPLICAS)
    rng = random.Random(7)
    hot_keys = KEYS[:3]
    loads = Counter()
    for _ in range(400):
        key = rng.choice(hot_keys) if rng.random() < 0.8 else rng.choice(KEYS)
        bound = load_bound(loads, REPLICAS, 1.25)
        choice = choose_bounded(ring, key, loads, load_factor=1.25)
        loads[choice.replica] += 1
        assert loads[choice.replica] <= bound
    mean = sum(loads.values()) / len(REPLICAS)
    assert max(loads.values()) <= 1.25 * mean + 1


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        HashRing(REPLICAS, virtual_nodes=0)
    with pytest.raises(ValueError):
        choose_bounded(HashRing(REPLICAS), "k", {}, load_factor=0.9)
    with pytest.raises(ValueError):
        choose_bounded(HashRing(REPLICAS), "k", {}, min_bound=-1)
    assert choose_bounded(HashRing(), "k", {}) is None


def test_a_further_condition_takes_the_first_meeting_both_else_the_load_bound_decides() -> None:
    ring = HashRing(REPLICAS)
    key = "conversation-fits"
    walk = list(ring.walk(key))
    loads = {walk[1]: 100}  # the second on the walk is over the load bound
    choice = choose_bounded(ring, key, loads, fits=lambda replica: replica not in walk[:1])
    assert choice.replica == walk[2] and choice.spilled
    nobody = choose_bounded(ring, key, loads, fits=lambda replica: False)
    assert nobody.replica == walk[0] and not nobody.spilled
