"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018).

A key goes to the first replica clockwise from its hash on the ring (its owner), unless that
replica already carries more than ``load_factor`` times the mean load; then to the next
replica on the ring that is under the bound. The bound never drops below ``min_bound``
ongoing requests: a batching engine is barely slowed by a few more sequences, while a spill
costs a whole prefill on a replica that holds none of the conversation, so at low load
affinity wins (the same idea as SGLang's ``balance_abs_threshold``). Affinity holds while
load is even, no replica is overloaded by hot keys, and adding or removing one of N replicas
moves about 1/N of the keys (only those whose owner changed).

Pure Python, no Ray: the conversation placer (``affinity.py``) builds on it; tests use it as is.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

DEFAULT_VIRTUAL_NODES = 160
DEFAULT_LOAD_FACTOR = 1.25
DEFAULT_MIN_BOUND = 16


def stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process (``hash()`` is salted per process), so
    every ingress replica's router builds the same ring and agrees on each key's owner."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, members: Iterable[str] = (), virtual_nodes: int = DEFAULT_VIRTUAL_NODES):
        if virtual_nodes <= 0:
            raise ValueError("virtual_nodes must be positive")
        self.virtual_nodes = virtual_nodes
        self._members: frozenset[str] = frozenset()
        self._points: list[int] = []
        self._owners: list[str] = []
        self.set_members(members)

    @property
    def members(self) -> frozenset[str]:
        return self._members

    def set_members(self, members: Iterable[str]) -> None:
        members = frozenset(members)
        if members == self._members:
            return
        points = sorted(
            (stable_hash(f"{member}#{index}"), member)
            for member in members
            for index in range(self.virtual_nodes)
        )
        self._points = [point for point, _ in points]
        self._owners = [member for _, member in points]
        self._members = members

    def walk(self, key: str) -> Iterator[str]:
        """Distinct members clockwise from the key's position: the owner first."""
        if not self._points:
            return
        start = bisect.bisect_right(self._points, stable_hash(key))
        seen: set[str] = set()
        for offset in range(len(self._points)):
            member = self._owners[(start + offset) % len(self._points)]
            if member not in seen:
                seen.add(member)
                yield member
                if len(seen) == len(self._members):
                    return

    def owner(self, key: str) -> str | None:
        return next(self.walk(key), None)


def validate_bounds(load_factor: float, min_bound: int) -> None:
    if load_factor < 1:
        raise ValueError("load_factor must be at least 1")
    if min_bound < 0:
        raise ValueError("min_bound must not be negative")


@dataclass(frozen=True)
class Choice:
    replica: str
    spilled: bool  # False when the ring owner took it
    # A new conversation placed off its ring owner to even the load: unlike a spill, this moves
    # no cached prefix (the conversation has none yet). Set by the conversation placer.
    balanced: bool = False


def load_bound(
    loads: Mapping[str, int],
    members: Iterable[str],
    load_factor: float,
    min_bound: int = DEFAULT_MIN_BOUND,
) -> float:
    """Most requests a replica may hold, counting the one being placed: ``load_factor`` times
    the mean, but never under the mean rounded up (so some replica always has room) nor under
    ``min_bound``. Not rounded up itself: at a mean of 2.6 and c = 1.25 a replica may hold 3,
    not ceil(3.25) = 4, which would let one replica carry 1.5 times the mean."""
    members = list(members)
    mean = (sum(loads.get(member, 0) for member in members) + 1) / len(members)
    return max(min_bound, math.ceil(mean), load_factor * mean)


def choose_bounded(
    ring: HashRing,
    key: str,
    loads: Mapping[str, int],
    load_factor: float = DEFAULT_LOAD_FACTOR,
    min_bound: int = DEFAULT_MIN_BOUND,
    fits: Callable[[str], bool] | None = None,
) -> Choice | None:
    """The replica for ``key``: its owner, or the next one on the ring under the load bound.

    ``fits`` is a further condition (the placer's bound in conversations): the first replica
    under the load bound that meets it, else the first under the load bound alone.
    """
    validate_bounds(load_factor, min_bound)
    if not ring.members:
        return None
    bound = load_bound(loads, ring.members, load_factor, min_bound)
    owner = under_bound = None
    for replica in ring.walk(key):
        owner = owner or replica
        if loads.get(replica, 0) + 1 <= bound:
            if fits is None or fits(replica):
                return Choice(replica, spilled=replica != owner)
            under_bound = under_bound or replica
    if owner is None:  # never (each member has points), but no owner is an empty ring's answer
        return None
    # The least loaded replica is under the mean rounded up, so the owner is only a total
    # function's last resort.
    chosen = under_bound or owner
    return Choice(chosen, spilled=chosen != owner)
