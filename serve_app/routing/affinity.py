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
  every ingress replica places a conversation alike. The ``min_bound`` floor that keeps known
  conversations home does not apply: a new conversation has no prefix to lose, so it goes to
  an emptier replica as soon as its owner is over the bound, even at a few requests each
  (TTFT p90 216 against 234 ms with the floor, in the 5,000 tokens/s replay of docs/routing.md).
- A new conversation is also kept off replicas that already have more than
  ``new_load_factor`` (1.1) times the mean number of active conversations (balanced
  placement; ``None`` turns it off). A new conversation costs the same everywhere (only the
  shared system and developer prompt is cached, and every replica has that), so this evens the
  load at no cost in hits. The counts are the replicas' reports (``directory.py``), the same
  for every router, plus the conversations this router placed or moved since the replica
  they went to last reported: without those, every new conversation between two reports
  would see the same counts and go to the same emptiest replica (a replica just added reports
  none). On Ray with the simulated engine the busiest replica then did 1.12 times the mean
  work (1.13 at worst over six runs) against 1.16 (1.29) without them and 1.42 for Ray's
  ``ConsistentHashRouter``. Routers' counts differ, then, by their own recent placements, and
  the next turn of a conversation may reach another ingress replica before it is reported:
  the request router waits for a round of reports first (``router.py``), so that turn is not
  placed anew.
- A **known** conversation goes to its home while the home holds at most ``spill_factor``
  times the mean ongoing requests (never less than ``min_bound``, 16); otherwise it spills to the
  next replica on the ring under ``load_factor`` times the mean, which becomes its home (it now
  holds the newest prefix). Staying is judged more leniently than placing (2 against 1.25 by
  default) because a spill costs a whole prefill of the conversation, while a batching engine
  is barely slowed by a few more sequences; the placement of new conversations keeps the
  replicas even. The floor keeps a home through a moment's burst: on Ray, homes briefly at 8
  to 10 requests (against a mean of 4) spilled up to 17 turns a run at a floor of 8, each a
  whole prefill; at 16, none. In a replay at four times the load per replica with the floor
  at 8, spilling at 1.25 doubled TTFT p90 against spilling at 2 (``loadtests/sim_routing.py``,
  see docs/routing.md); with the floor at 16 the two are level there.

Scaling: adding a replica moves no conversation (the new one takes new conversations and
spills); removing one re-places only that replica's conversations. Conversations idle for
``idle_s`` are forgotten and count as new again, unless their latest request asked a longer
prompt-cache ``ttl`` (``GenerateRequest.cache_ttl_s``, at most ``max_ttl_s``): then they keep
their home that long (``directory.py``); the table holds at most ``max_conversations``.

A conversation's home is the replica that served it last, by this router's own table (which
knows its own placements and spills at once) or by the replicas' reports (which know every
router's, a routing-stats period late): an ingress replica learns where another placed or
spilled a conversation without any call on the routing path.

Pure Python, no Ray: the request router wraps it; tests and benchmarks use it as is.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from serve_app.routing.directory import (
    DEFAULT_IDLE_S,
    DEFAULT_MAX_TTL_S,
    ConversationDirectory,
    ConversationTable,
    DirectoryMerger,
    Sighting,
)
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
from serve_app.routing.ttft import (
    DEFAULT_PREFILL_TOKENS_PER_S,
    DEFAULT_TTFT_SLACK_S,
    TTFTPredictor,
)

DEFAULT_SPILL_FACTOR = 2.0
DEFAULT_NEW_LOAD_FACTOR = 1.1
DEFAULT_MAX_CONVERSATIONS = 100_000
# A conversation with a turn within this long still runs (think times between turns are
# seconds): its next turns are work to come on its replica (docs/routing.md).
DEFAULT_LIVE_S = 10.0


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
        max_ttl_s: float = DEFAULT_MAX_TTL_S,
        ttft_slack_s: float | None = DEFAULT_TTFT_SLACK_S,
        live_s: float = DEFAULT_LIVE_S,
        prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
        shared_kv_pull_tokens_per_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        validate_bounds(load_factor, min_bound)
        if new_load_factor is not None:
            validate_bounds(new_load_factor, 0)
        if spill_factor < load_factor:
            raise ValueError("spill_factor must be at least load_factor")
        if ttft_slack_s is not None and ttft_slack_s < 0:
            raise ValueError("ttft_slack_s must not be negative")
        if live_s <= 0:
            raise ValueError("live_s must be positive")
        if prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be positive")
        if shared_kv_pull_tokens_per_s is not None and shared_kv_pull_tokens_per_s <= 0:
            raise ValueError("shared_kv_pull_tokens_per_s must be positive (or None: no tier)")
        self.load_factor = load_factor
        self.min_bound = min_bound
        self.new_load_factor = new_load_factor
        self.spill_factor = spill_factor
        self.ring = HashRing(virtual_nodes=virtual_nodes)
        self.table: ConversationTable[str] = ConversationTable(
            idle_s, max_conversations, clock, max_ttl_s
        )
        self.directory = ConversationDirectory()
        # The reports merged as they come: only those made since the last are read again.
        self._merger = DirectoryMerger()
        self._clock = clock
        # Conversations this router placed or moved that the replicas have not reported since:
        # the counts behind balanced placement include them at once, not a period later.
        self._unreported: dict[str, Sighting] = {}
        # Conversations seen within ``live_s`` by the latest reports: (last seen, replica).
        self.live_s = live_s
        self._live: list[tuple[float, str]] | None = None
        # Placement by predicted time to first token (``ttft.py``); None: by the ring alone.
        self.ttft_slack_s = ttft_slack_s
        # The replicas share a KV tier (``--kv-tier shared``) pulled at this rate; None: none.
        self.predictor = TTFTPredictor(
            prefill_tokens_per_s, clock, shared_pull_tokens_per_s=shared_kv_pull_tokens_per_s
        )

    def set_members(self, members: Iterable[str]) -> None:
        self.ring.set_members(members)

    def set_directory(self, directory: ConversationDirectory) -> None:
        """The replicas' latest reports of the conversations they serve."""
        self.directory = directory
        self._live = None
        # A placement the replica reported after is in these counts (or never reached it).
        # One whose replica does not report is kept until idle, so the dict stays bounded.
        horizon = self.table.horizon()
        self._unreported = {
            key: placed
            for key, placed in self._unreported.items()
            if horizon <= placed.last_seen >= directory.reported_at.get(placed.replica, horizon)
        }

    def set_reports(self, reports: Mapping[str, Mapping[str, Any]]) -> None:
        """The replicas' latest routing stats, whole: the conversations they served (the
        directory) and what a turn would wait for there (the TTFT predictor)."""
        # Conversations kept by their ttl alone are homes, not load (``directory.py``).
        horizon = self.table.horizon()
        recent = self._clock() - self.live_s  # what `_live_conversations` reads until the next
        self.set_directory(self._merger.merge(reports, horizon, recent))
        self.predictor.update(reports)

    def knows(self, key: str) -> bool:
        """Whether ``key`` has a home: it was served recently, by this router's table or by
        the replicas' reports."""
        return self._home(key) is not None

    def choose(
        self,
        key: str,
        loads: Mapping[str, int],
        prompt_tokens: int | None = None,
        request_id: str | None = None,
        ttl_s: float | None = None,
        priority: int | None = None,
    ) -> Choice | None:
        """The replica for this request of conversation ``key``, given ongoing requests (and
        the prompt's length, to place by predicted time to first token). ``ttl_s``: how long
        the request asked its prefix kept; the conversation keeps its home at least that
        long after this request (None: ``idle_s``). ``priority``: its rank (its service tier's,
        issue 49): its predicted time counts only the queue it would not pass."""
        members = self.ring.members
        if not members:
            return None
        home = self._home(key)
        if self.ttft_slack_s is not None and prompt_tokens is not None:
            choice = self._place_by_ttft(key, loads, home, prompt_tokens, priority)
        elif home is None:
            choice = self._place_new(key, loads)
        elif loads.get(home, 0) + 1 <= load_bound(
            loads, members, self.spill_factor, self.min_bound
        ):
            choice = Choice(home, spilled=False)
        else:  # the home is over the bound, so the walk passes it by
            walked = choose_bounded(self.ring, key, loads, self.load_factor, self.min_bound)
            choice = None if walked is None else Choice(walked.replica, walked.replica != home)
        if choice is None:  # the ring had none to walk (`choose_bounded`): the router falls
            return None  # back as for an empty ring
        self.table.assign(key, choice.replica, ttl_s)
        if prompt_tokens is not None:
            self.predictor.sent(choice.replica, key, prompt_tokens, request_id, priority)
        if choice.replica != home:
            self._unreported[key] = Sighting(
                choice.replica, self._clock(), self.table.clamp_ttl(ttl_s)
            )
        return choice

    def _home(self, key: str) -> str | None:
        """The running replica that served ``key`` last, by this router's table or by the
        replicas' reports (another ingress replica may have placed or spilled it since).
        Within its lifetime by this router's ``idle_s`` and its ttl: replicas forget on their
        own, maybe later."""
        sightings = [
            sighting
            for sighting in (self.table.home(key), self.directory.home(key))
            if sighting is not None
            and sighting.replica in self.ring.members
            and self.table.kept(sighting)
        ]
        latest = max(sightings, key=lambda sighting: sighting.last_seen, default=None)
        return latest.replica if latest else None

    def _place_by_ttft(
        self,
        key: str,
        loads: Mapping[str, int],
        home: str | None,
        prompt_tokens: int,
        priority: int | None = None,
    ) -> Choice | None:
        """The lowest predicted TTFT among the replicas the bounds allow; within
        ``ttft_slack_s`` of it, the home, else the first on the ring from the key. A new
        conversation, which holds nothing anywhere, goes within the slack to the replica
        running fewest conversations (a turn within ``live_s``): their next turns are the work
        to come there, which the bound on conversations (counted over ``idle_s``, ended ones
        too) does not see. By the ring alone, the busiest replica did 1.13 times the mean
        work in the replay against today's placer's 1.09 (docs/routing.md).

        The bounds are today's: a known conversation may stay home under ``spill_factor``
        times the mean ongoing requests (floor ``min_bound``) and go elsewhere under
        ``load_factor`` (same floor); a new one goes under ``load_factor`` with no floor, and
        under ``new_load_factor`` times the mean conversations where any replica is."""
        members = self.ring.members
        ring = list(self.ring.walk(key))
        if home is None:
            bound = load_bound(loads, members, self.load_factor, 0)
            under = [replica for replica in ring if loads.get(replica, 0) + 1 <= bound]
            factor = self.new_load_factor
            if factor is not None:
                fits = self._under_conversations_bound(factor)
                under = [replica for replica in under if fits(replica)] or under
        else:
            bound = load_bound(loads, members, self.load_factor, self.min_bound)
            stay = load_bound(loads, members, self.spill_factor, self.min_bound)
            under = [
                replica
                for replica in [home, *(replica for replica in ring if replica != home)]
                if loads.get(replica, 0) + 1 <= (stay if replica == home else bound)
            ]
        predictor = self.predictor
        uncached = {replica: predictor.uncached(replica, key, prompt_tokens) for replica in ring}
        fewest = min(uncached.values())

        def cost(replica: str) -> float:
            ttft = predictor.predict(replica, key, prompt_tokens, priority)
            if predictor.evicting(replica):
                ttft += (uncached[replica] - fewest) / predictor.rate(replica)
            return ttft

        if home is None:
            # A new conversation holds nothing anywhere: ties go to the replica running fewest
            # conversations, whose next turns are the work to come, then the ring from the key.
            live = self._live_conversations()
            order = sorted(under or ring, key=lambda replica: live[replica])
        else:
            # Affinity breaks ties: the replica holding most of the conversation first (its
            # home, unless the home evicted it), then the home, then the ring from the key.
            order = sorted(under or ring, key=lambda replica: uncached[replica])
        chosen = choose_fastest(order, cost, self.ttft_slack_s or 0.0)
        if chosen is None:
            return None
        if home is None:
            return Choice(chosen, spilled=False, balanced=chosen != ring[0])
        return Choice(chosen, spilled=chosen != home)

    def _place_new(self, key: str, loads: Mapping[str, int]) -> Choice | None:
        """Bounded loads counted in ongoing requests, and in active conversations if asked.
        Off its ring owner the conversation is ``balanced``, not ``spilled``: it moves nothing.
        No ``min_bound`` floor here: the floor keeps a conversation with the replica that holds
        its prefix, and a new conversation has none to lose, so it takes the emptier replica."""
        factor = self.new_load_factor
        fits = None if factor is None else self._under_conversations_bound(factor)
        choice = choose_bounded(self.ring, key, loads, self.load_factor, 0, fits)
        if choice is None:
            return None
        return Choice(choice.replica, spilled=False, balanced=choice.spilled)

    def _under_conversations_bound(self, new_load_factor: float) -> Callable[[str], bool]:
        """Whether a replica can take one more conversation under ``new_load_factor``."""
        active = self._active_conversations()
        bound = load_bound(active, self.ring.members, new_load_factor, 0)
        return lambda replica: active[replica] + 1 <= bound

    def _active_conversations(self) -> Counter[str]:
        """Conversations per replica: the replicas' reports, plus what this router placed or
        moved since the replica it went to last reported. Other routers' placements show a
        period late; the wait for reports (``router.py``) keeps a later turn from being placed
        anew where routers' counts differ."""
        return self._with_unreported(Counter(self.directory.active), float("-inf"))

    def _live_conversations(self) -> Counter[str]:
        """Conversations per replica with a turn within ``live_s``, counted as the active ones:
        those still running, not those that ended minutes ago and cost nothing more."""
        since = self._clock() - self.live_s
        if self._live is None:  # the reports' recent sightings, once a report (few: seconds')
            self._live = [
                (sighting.last_seen, sighting.replica)
                for sighting in self.directory.seen_since(since)
            ]
        live = Counter(replica for last_seen, replica in self._live if last_seen >= since)
        return self._with_unreported(live, since)

    def _with_unreported(self, counts: Counter[str], since: float) -> Counter[str]:
        """``counts`` (the reports', of conversations seen since ``since``) with this router's
        placements and moves since the replica they went to last reported."""
        for key, placed in self._unreported.items():
            if placed.last_seen < since:
                continue
            counts[placed.replica] += 1
            before = self.directory.home(key)
            if (
                before is not None
                and before.replica != placed.replica
                and before.last_seen >= since
                and self.directory.is_active(before)  # counted in the reports' figure
            ):
                counts[before.replica] -= 1
        return counts


def choose_fastest(
    candidates: Iterable[str], predict: Callable[[str], float], slack_s: float
) -> str | None:
    """The first of ``candidates`` (in affinity order) predicted within ``slack_s`` of the
    lowest prediction; None if there are none."""
    predictions = {replica: predict(replica) for replica in candidates}
    if not predictions:
        return None
    best = min(predictions.values())
    return next(replica for replica, ttft in predictions.items() if ttft <= best + slack_s)
