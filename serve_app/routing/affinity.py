"""Where each conversation is served: its home replica, kept while that replica has room.

The ring (``ring.py``) alone sends a conversation to the replica its key hashes to. That keeps
every turn on one replica, but the hash also decides how many conversations each replica gets,
and with a few dozen conversations per replica some get half as many again as others. Bounded
loads fix that only by moving turns of running conversations, and a moved turn is a full prefill
on a replica that holds none of the conversation.

So the choice is made once, when a conversation is new, and remembered:

- A **new** conversation goes to its ring owner unless that replica holds more than
  ``load_factor`` times the mean ongoing requests; then to the next replica on the ring under
  that bound (consistent hashing with bounded loads). Every router computes the same owner, so
  every ingress replica places a conversation alike.
- A new conversation is also kept off replicas that already have more than
  ``new_load_factor`` (1.1) times the mean number of active conversations (balanced
  placement; ``None`` turns it off). A new conversation costs the same everywhere (only the
  shared system and developer prompt is cached, and every replica has that), so this evens the
  load at no cost in hits. The counts are the replicas' own reports (``directory.py``), the
  same for every router, so ingress replicas place alike. In a replay with two ingress
  replicas it kept hashing's hit rate, cut the busiest replica's work from 1.27 to 1.16 times
  the mean, and at a load where prefills queue, TTFT p90 by 6%. Reports change, though: the
  next turn of a conversation may reach another ingress replica before the conversation is
  reported, and that router, counting from a newer report, could place it elsewhere. The
  request router closes that gap by waiting for a round of reports first (``router.py``).
- A **known** conversation goes to its home while the home holds at most ``spill_factor``
  times the mean ongoing requests (never less than ``min_bound``); otherwise it spills to the
  next replica on the ring under ``load_factor`` times the mean, which becomes its home (it now
  holds the newest prefix). Staying is judged more leniently than placing (2 against 1.25 by
  default) because a spill costs a whole prefill of the conversation, while a batching engine
  is barely slowed by a few more sequences; the placement of new conversations keeps the
  replicas even. In a replay with about 25 ongoing requests per replica, spilling at 1.25
  doubled TTFT p90 against spilling at 2 (``loadtests/sim_routing.py``, see the README).

Scaling: adding a replica moves no conversation (the new one takes new conversations and
spills); removing one re-places only that replica's conversations. Conversations idle for
``idle_s`` are forgotten and count as new again; the table holds at most ``max_conversations``.

A conversation's home is the replica that served it last, by this router's own table (which
knows its own placements and spills at once) or by the replicas' reports (which know every
router's, a routing-stats period late): an ingress replica learns where another placed or
spilled a conversation without any call on the routing path.

Pure Python, no Ray: the request router wraps it; tests and benchmarks use it as is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from serve_app.routing.directory import DEFAULT_IDLE_S, ConversationDirectory, ConversationTable
from serve_app.routing.ring import (
    DEFAULT_LOAD_FACTOR,
    DEFAULT_MIN_BOUND,
    DEFAULT_VIRTUAL_NODES,
    Choice,
    HashRing,
    choose_bounded,
    load_bound,
    validate_bounds,
)

DEFAULT_SPILL_FACTOR = 2.0
DEFAULT_NEW_LOAD_FACTOR = 1.1
DEFAULT_MAX_CONVERSATIONS = 100_000


class ConversationPlacer:
    """Chooses the replica for each request of a conversation (see the module docstring)."""

    def __init__(
        self,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        min_bound: int = DEFAULT_MIN_BOUND,
        new_load_factor: float | None = DEFAULT_NEW_LOAD_FACTOR,
        spill_factor: float = DEFAULT_SPILL_FACTOR,
        virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
        idle_s: float = DEFAULT_IDLE_S,
        max_conversations: int = DEFAULT_MAX_CONVERSATIONS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        validate_bounds(load_factor, min_bound)
        if new_load_factor is not None:
            validate_bounds(new_load_factor, 0)
        if spill_factor < load_factor:
            raise ValueError("spill_factor must be at least load_factor")
        self.load_factor = load_factor
        self.min_bound = min_bound
        self.new_load_factor = new_load_factor
        self.spill_factor = spill_factor
        self.ring = HashRing(virtual_nodes=virtual_nodes)
        self.table: ConversationTable[str] = ConversationTable(idle_s, max_conversations, clock)
        self.directory = ConversationDirectory()

    def set_members(self, members: Iterable[str]) -> None:
        self.ring.set_members(members)

    def set_directory(self, directory: ConversationDirectory) -> None:
        """The replicas' latest reports of the conversations they serve."""
        self.directory = directory

    def knows(self, key: str) -> bool:
        """Whether ``key`` has a home: it was served recently, by this router's table or by
        the replicas' reports."""
        return self._home(key) is not None

    def choose(self, key: str, loads: Mapping[str, int]) -> Choice | None:
        """The replica for this request of conversation ``key``, given ongoing requests."""
        members = self.ring.members
        if not members:
            return None
        home = self._home(key)
        if home is None:
            choice = self._place_new(key, loads)
        elif loads.get(home, 0) + 1 <= load_bound(
            loads, members, self.spill_factor, self.min_bound
        ):
            choice = Choice(home, spilled=False)
        else:  # the home is over the bound, so the walk passes it by
            choice = choose_bounded(self.ring, key, loads, self.load_factor, self.min_bound)
            assert choice is not None
            choice = Choice(choice.replica, spilled=choice.replica != home)
        self.table.assign(key, choice.replica)
        return choice

    def _home(self, key: str) -> str | None:
        """The running replica that served ``key`` last, by this router's table or by the
        replicas' reports (another ingress replica may have placed or spilled it since)."""
        horizon = self.table.horizon()  # replicas forget on their own idle_s, maybe longer
        sightings = [
            sighting
            for sighting in (self.table.home(key), self.directory.home(key))
            if sighting is not None
            and sighting.replica in self.ring.members
            and sighting.last_seen >= horizon
        ]
        latest = max(sightings, key=lambda sighting: sighting.last_seen, default=None)
        return latest.replica if latest else None

    def _place_new(self, key: str, loads: Mapping[str, int]) -> Choice:
        """Bounded loads counted in ongoing requests, and in active conversations if asked.
        Off its ring owner the conversation is ``balanced``, not ``spilled``: it moves nothing."""
        fits = self._under_conversations_bound() if self.new_load_factor is not None else None
        choice = choose_bounded(self.ring, key, loads, self.load_factor, self.min_bound, fits)
        assert choice is not None
        return Choice(choice.replica, spilled=False, balanced=choice.spilled)

    def _under_conversations_bound(self) -> Callable[[str], bool]:
        """Whether a replica can take one more conversation under ``new_load_factor``. The
        replicas' reported counts, not this router's own: every router sees the same reports,
        so ingress replicas place a new conversation alike."""
        assert self.new_load_factor is not None
        active = self.directory.active
        bound = load_bound(active, self.ring.members, self.new_load_factor, 0)
        return lambda replica: active[replica] + 1 <= bound
