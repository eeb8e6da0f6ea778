"""Where conversations are served, as engine replicas report it to every router.

Each ingress replica runs its own request router with its own table of homes, so a
conversation one of them placed or spilled off its ring owner is unknown to the others, which
would send its next turn to the owner and lose the cached prefix. Ray Serve's routing stats
close that gap: the controller calls each replica's ``record_routing_stats`` every
``request_routing_stats_period_s`` and hands the results to every router with the replica
list. The engine deployment reports the conversations it served recently
(``ServedConversations``); each router merges the reports into a ``ConversationDirectory``:
where each conversation was last served, and how many each replica holds. Every router sees the
same reports, so decisions made from them agree across ingress replicas. They lag by about a
period, so the directory complements a router's own table rather than replacing it.

Each report also says when it was made (``reported_at``). A router that gets the next turn of a
conversation it does not know can so wait for one round of reports made after the turn
arrived: the turn before it was served, and so recorded, before the client sent this one, so
that round names the replica that holds it, if any does (``ConversationDirectory.reported_since``).

Times are wall-clock seconds (``time.time``): reports from replicas on different nodes are
compared with each other and with the router's own table.

Ray Serve hands a router every replica's latest stats whenever any replica's changed (at most
once a controller loop, 0.1 s): with N replicas reporting every second, up to ten times a
second, each time N reports. A router merges them with `DirectoryMerger`, which reads again only
the reports made since it last merged (a report is known by its ``reported_at``) and decides
again only the conversations whose sighting there changed: its work per second grows with the
turns served, not with the reports delivered (N ten times a second) nor with the conversations
they repeat. Rebuilding the directory from every report on each delivery
(`ConversationDirectory.from_reports`) cost 99 ms at 256 replicas of 188 conversations each,
about a core per ingress replica at ten deliveries a second; merging costs 2.9 ms
(loadtests/sim_scale.py --steady-only, docs/benchmarks.md).

A request's prompt-cache ``ttl`` (``GenerateRequest.cache_ttl_s``: 30 min by default through the
app, 12 h asked) is a minimum lifetime: a conversation is kept, in a router's table and in its
replica's report, for the longer of ``idle_s`` and its latest request's ttl (at most
``max_ttl_s``) after that request, so its next turn goes home however long the client paused.
Both stay bounded: past ``max_conversations`` (``max_reported``) the least recently served
conversation goes first, ttl or not, so a ttl is a floor on a conversation's lifetime while
there is room, never a reservation one tenant can hold against the others. Only conversations
served within ``idle_s`` count as active (the counts behind balanced placement): one kept by its
ttl alone holds cache, not work.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from serve_app.protocol.prompt_cache import TTL_SECONDS
from serve_app.routing.ring import stable_hash

DEFAULT_IDLE_S = 300.0
# The longest ttl a request can ask (``12h``, as OpenAI's API): a longer one is kept this long.
DEFAULT_MAX_TTL_S = float(max(TTL_SECONDS.values()))
# Ray Serve sends every replica's stats to every router whenever one replica's change, so
# reports are kept small: conversations as 64-bit hashes (about 20 bytes each, pickled), and
# past this many per replica the oldest go unreported (routers still place them by the ring).
DEFAULT_MAX_REPORTED = 4096
REPORT_KEY = "conversations"
REPORTED_AT_KEY = "reported_at"
# The reported conversations whose latest request asked a ttl, grouped by it: {ttl_s: [hash]}
# (a few distinct ttls, so a few lists; absent when none did).
TTL_KEY = "conversation_ttl_s"

K = TypeVar("K", str, int)


@dataclass(frozen=True)
class Sighting:
    replica: str
    last_seen: float
    # The ttl in seconds the latest request asked (0: none; kept for the holder's idle_s).
    ttl_s: float = 0.0


class ConversationTable(Generic[K]):
    """Where and when each recent conversation was last served.

    A conversation is kept for its lifetime after its latest request: ``idle_s``, or that
    request's ttl when longer (at most ``max_ttl_s``). Entries are queued by lifetime, each
    queue in last-seen order, so forgetting the expired pops from the queues' fronts, and the
    least recently served (dropped past ``max_conversations``) is one of the fronts. A router
    keeps one by routing key; an engine replica one by the key's hash, to report.
    """

    def __init__(
        self,
        idle_s: float,
        max_conversations: int,
        clock: Callable[[], float],
        max_ttl_s: float = DEFAULT_MAX_TTL_S,
    ):
        if idle_s <= 0 or max_conversations <= 0:
            raise ValueError("idle_s and max_conversations must be positive")
        if max_ttl_s < 0:
            raise ValueError("max_ttl_s must not be negative")
        self.idle_s = idle_s
        self.max_conversations = max_conversations
        self.max_ttl_s = max_ttl_s
        self._clock = clock
        # By lifetime in seconds: few queues (idle_s, 30 min, 12 h), each in last-seen order.
        self._queues: dict[float, OrderedDict[K, Sighting]] = {}
        self._lifetimes: dict[K, float] = {}

    def __len__(self) -> int:
        self._forget_expired()
        return len(self._lifetimes)

    def home(self, key: K) -> Sighting | None:
        self._forget_expired()
        lifetime = self._lifetimes.get(key)
        return None if lifetime is None else self._queues[lifetime][key]

    def assign(self, key: K, replica: str, ttl_s: float | None = None) -> None:
        """Record that ``key`` is served on ``replica`` now, asked kept ``ttl_s`` at least."""
        self._remove(key)
        ttl = self.clamp_ttl(ttl_s)
        lifetime = self.lifetime(ttl)
        self._queues.setdefault(lifetime, OrderedDict())[key] = Sighting(
            replica, self._clock(), ttl
        )
        self._lifetimes[key] = lifetime
        self._forget_expired()
        while len(self._lifetimes) > self.max_conversations:
            self._remove(self._least_recent())

    def sightings(self) -> Iterator[tuple[K, Sighting]]:
        """Every kept conversation, least recently served first."""
        self._forget_expired()
        return heapq.merge(
            *(queue.items() for queue in self._queues.values()),
            key=lambda item: item[1].last_seen,
        )

    def last_seen(self) -> dict[K, float]:
        return {key: sighting.last_seen for key, sighting in self.sightings()}

    def horizon(self) -> float:
        """Conversations last seen before this are idle (no longer active), unless a ttl
        keeps them (`kept`)."""
        return self._clock() - self.idle_s

    def clamp_ttl(self, ttl_s: float | None) -> float:
        return min(max(ttl_s or 0.0, 0.0), self.max_ttl_s)

    def lifetime(self, ttl_s: float) -> float:
        return max(self.idle_s, self.clamp_ttl(ttl_s))

    def kept(self, sighting: Sighting) -> bool:
        """Whether a sighting (this table's or a replica's report) is within its lifetime."""
        return sighting.last_seen >= self._clock() - self.lifetime(sighting.ttl_s)

    def _remove(self, key: K) -> None:
        lifetime = self._lifetimes.pop(key, None)
        if lifetime is not None:
            queue = self._queues[lifetime]
            del queue[key]
            if not queue:
                del self._queues[lifetime]

    def _least_recent(self) -> K:
        fronts = (next(iter(queue.items())) for queue in self._queues.values())
        return min(fronts, key=lambda item: item[1].last_seen)[0]

    def _forget_expired(self) -> None:
        now = self._clock()
        for lifetime, queue in list(self._queues.items()):
            horizon = now - lifetime
            while queue and next(iter(queue.values())).last_seen < horizon:
                del self._lifetimes[queue.popitem(last=False)[0]]
            if not queue:
                del self._queues[lifetime]


class ServedConversations:
    """On an engine replica: the conversations it served within their lifetime (``idle_s``,
    or the latest request's ttl when longer), to report."""

    def __init__(
        self,
        replica: str,
        idle_s: float = DEFAULT_IDLE_S,
        max_reported: int = DEFAULT_MAX_REPORTED,
        clock: Callable[[], float] = time.time,
        max_ttl_s: float = DEFAULT_MAX_TTL_S,
    ) -> None:
        self.replica = replica
        self._clock = clock
        self._table: ConversationTable[int] = ConversationTable(
            idle_s, max_reported, clock, max_ttl_s
        )

    def record(self, key: str, ttl_s: float | None = None) -> None:
        self._table.assign(stable_hash(key), self.replica, ttl_s)

    def report(self) -> dict[str, Any]:
        """The routing stats this replica hands Ray Serve: each kept conversation's last
        request time, by the hash of its key, least recent first; the ttl its latest request
        asked, if any (grouped by ttl); and when the report was made."""
        conversations: dict[int, float] = {}
        by_ttl: dict[float, list[int]] = {}
        for conversation, sighting in self._table.sightings():
            conversations[conversation] = sighting.last_seen
            if sighting.ttl_s:
                by_ttl.setdefault(sighting.ttl_s, []).append(conversation)
        report: dict[str, Any] = {REPORT_KEY: conversations, REPORTED_AT_KEY: self._clock()}
        if by_ttl:
            report[TTL_KEY] = by_ttl
        return report


@dataclass(frozen=True)
class ConversationDirectory:
    """On a router: every replica's report merged. A conversation reported by several replicas
    (it spilled) belongs to the one that served it last. ``active`` counts each replica's
    reported conversations, less those kept by their ttl alone: served before
    ``active_since`` (None: none is left out). ``recent``, when given (`DirectoryMerger`), holds
    at least every home last seen at or after the merger's ``recent_since``: what a router asks
    of the last seconds without reading every home."""

    homes: dict[int, Sighting] = field(default_factory=dict)  # by the key's stable_hash
    active: Counter[str] = field(default_factory=Counter)
    reported_at: dict[str, float] = field(default_factory=dict)  # by replica
    active_since: float | None = None
    recent: Mapping[int, Sighting] | None = None

    def seen_since(self, moment: float) -> Iterator[Sighting]:
        """The homes last seen at or after ``moment`` (from ``recent`` when it covers it)."""
        homes = self.homes if self.recent is None else self.recent
        return (sighting for sighting in homes.values() if sighting.last_seen >= moment)

    def home(self, key: str) -> Sighting | None:
        return self.homes.get(stable_hash(key))

    def is_active(self, sighting: Sighting) -> bool:
        """Whether ``sighting`` is counted in ``active``: one without a ttl is whenever its
        replica reports it (within the replica's idle_s, as before ttls)."""
        return (
            self.active_since is None
            or not sighting.ttl_s
            or sighting.last_seen >= self.active_since
        )

    def reported_since(self, moment: float) -> bool:
        """Whether every reporting replica's latest report was made at ``moment`` or later, so
        that a conversation served anywhere before then is in this directory."""
        return all(reported_at >= moment for reported_at in self.reported_at.values())

    @classmethod
    def from_reports(
        cls, reports: Mapping[str, Mapping[str, Any]], active_since: float | None = None
    ) -> ConversationDirectory:
        """``reports`` maps each replica to its routing stats; a replica that reports nothing
        (still starting, or another version during a rollout) contributes nothing.
        ``active_since``: the router's idle horizon; a conversation last served before it is
        kept by its ttl alone, a home but not a load."""
        homes: dict[int, Sighting] = {}
        reported_at: dict[str, float] = {}
        for replica, stats in reports.items():
            if REPORTED_AT_KEY in stats:
                reported_at[replica] = stats[REPORTED_AT_KEY]
            ttls = {
                conversation: ttl_s
                for ttl_s, conversations in (stats.get(TTL_KEY) or {}).items()
                for conversation in conversations
            }
            for conversation, last_seen in (stats.get(REPORT_KEY) or {}).items():
                known = homes.get(conversation)
                if known is None or last_seen > known.last_seen:
                    homes[conversation] = Sighting(replica, last_seen, ttls.get(conversation, 0.0))
        directory = cls(homes, reported_at=reported_at, active_since=active_since)
        directory.active.update(
            sighting.replica for sighting in homes.values() if directory.is_active(sighting)
        )
        return directory


class DirectoryMerger:
    """A router's `ConversationDirectory`, kept up to date from the replicas' reports as Ray
    Serve delivers them: every replica's latest, each time any changed. A report already merged
    (the same ``reported_at`` from the same replica) is not read again; a new one replaces that
    replica's sightings, and only the conversations whose sighting there changed (served since,
    new, or gone) are decided again (each belongs to the replica that served it last, as in
    `from_reports`; two replicas reporting the same conversation at the very same time:
    either). The counts of active conversations and the recent homes are kept as homes change,
    and as ``active_since`` and ``recent_since`` move forward, each home leaves them once (a heap
    by time). A merge costs one look at each replica's ``reported_at``, one read of each changed
    report, and a decision for each conversation served since: not every conversation of every
    report, nor every conversation of a changed one."""

    def __init__(self) -> None:
        self._merged_at: dict[str, float] = {}  # replica -> reported_at of the report merged
        self._sightings: dict[str, dict[int, Sighting]] = {}  # replica -> what it reported
        self._order: dict[str, int] = {}  # replica -> when first merged (ties go to the first)
        self._holders: dict[int, set[str]] = {}  # conversation -> the replicas reporting it
        self.homes: dict[int, Sighting] = {}
        self.active: Counter[str] = Counter()
        self._counted: dict[int, Sighting] = {}  # the homes counted in ``active``
        self._active_since: float | None = None
        self._expiring: list[tuple[float, int, int, Sighting]] = []  # counted homes with a ttl
        self.recent: dict[int, Sighting] = {}
        self._recent_since = float("-inf")
        self._aging: list[tuple[float, int, int, Sighting]] = []  # homes in ``recent``
        self._pushes = itertools.count()  # heap ties, never comparing sightings

    def merge(
        self,
        reports: Mapping[str, Mapping[str, Any]],
        active_since: float | None = None,
        recent_since: float | None = None,
    ) -> ConversationDirectory:
        """The directory of ``reports`` (as `ConversationDirectory.from_reports` builds it),
        with ``recent`` holding the homes last seen at or after ``recent_since``."""
        for replica in [gone for gone in self._sightings if gone not in reports]:
            self._replace(replica, {})
            del self._sightings[replica]
            self._merged_at.pop(replica, None)
        reported_at: dict[str, float] = {}
        for replica, stats in reports.items():
            at = stats.get(REPORTED_AT_KEY)
            if at is not None:
                reported_at[replica] = at
                if self._merged_at.get(replica) == at and replica in self._sightings:
                    continue
            self._order.setdefault(replica, len(self._order))
            self._replace(replica, _sightings(replica, stats, self._sightings.get(replica)))
            if at is not None:
                self._merged_at[replica] = at
        self._expire_active(active_since)
        self._age_recent(float("-inf") if recent_since is None else recent_since)
        return ConversationDirectory(
            self.homes, self.active, reported_at, active_since, self.recent
        )

    def _replace(self, replica: str, sightings: dict[int, Sighting]) -> None:
        """``sightings`` holds the very objects of the replica's previous report where a
        conversation's sighting is unchanged (`_sightings`): only the others are decided again."""
        old = self._sightings.get(replica, {})
        self._sightings[replica] = sightings
        for conversation in old.keys() - sightings.keys():
            holders = self._holders[conversation]
            holders.discard(replica)
            if not holders:
                del self._holders[conversation]
            self._decide(conversation)
        for conversation, sighting in sightings.items():
            before = old.get(conversation)
            if before is None:
                self._holders.setdefault(conversation, set()).add(replica)
            elif before is sighting:
                continue
            self._decide(conversation)

    def _decide(self, conversation: int) -> None:
        """The conversation's home again, from the replicas that report it."""
        holders = self._holders.get(conversation, ())
        home = max(
            (self._sightings[holder][conversation] for holder in holders),
            key=lambda sighting: (sighting.last_seen, -self._order[sighting.replica]),
            default=None,
        )
        if self.homes.get(conversation) is home:
            return
        counted = self._counted.pop(conversation, None)
        if counted is not None:
            self.active[counted.replica] -= 1
            if not self.active[counted.replica]:
                del self.active[counted.replica]
        self.recent.pop(conversation, None)
        if home is None:
            del self.homes[conversation]
            return
        self.homes[conversation] = home
        if self._is_active(home):
            self._count(conversation, home)
        if home.last_seen >= self._recent_since:
            self.recent[conversation] = home
            entry = (home.last_seen, next(self._pushes), conversation, home)
            heapq.heappush(self._aging, entry)

    def _is_active(self, sighting: Sighting) -> bool:
        since = self._active_since
        return since is None or not sighting.ttl_s or sighting.last_seen >= since

    def _count(self, conversation: int, home: Sighting) -> None:
        self._counted[conversation] = home
        self.active[home.replica] += 1
        if home.ttl_s:  # leaves the count once active_since passes it
            entry = (home.last_seen, next(self._pushes), conversation, home)
            heapq.heappush(self._expiring, entry)

    def _expire_active(self, active_since: float | None) -> None:
        before, self._active_since = self._active_since, active_since
        if active_since is None or (before is not None and active_since < before):
            # Every home counts again (no horizon), or the horizon moved back: count afresh.
            self.active.clear()
            self._counted.clear()
            self._expiring.clear()
            for conversation, home in self.homes.items():
                if self._is_active(home):
                    self._count(conversation, home)
            return
        while self._expiring and self._expiring[0][0] < active_since:
            _, _, conversation, home = heapq.heappop(self._expiring)
            if self._counted.get(conversation) is home:
                del self._counted[conversation]
                self.active[home.replica] -= 1
                if not self.active[home.replica]:
                    del self.active[home.replica]

    def _age_recent(self, recent_since: float) -> None:
        if recent_since < self._recent_since:  # moved back: gather afresh
            self._recent_since = recent_since
            self.recent = {c: h for c, h in self.homes.items() if h.last_seen >= recent_since}
            self._aging = [(h.last_seen, next(self._pushes), c, h) for c, h in self.recent.items()]
            heapq.heapify(self._aging)
            return
        self._recent_since = recent_since
        while self._aging and self._aging[0][0] < recent_since:
            _, _, conversation, home = heapq.heappop(self._aging)
            if self.recent.get(conversation) is home:
                del self.recent[conversation]


def _sightings(
    replica: str, stats: Mapping[str, Any], before: Mapping[int, Sighting] | None = None
) -> dict[int, Sighting]:
    """What one replica's report says: each conversation's sighting there, the very object of
    ``before`` (its previous report's) where unchanged: a report repeats every conversation the
    replica keeps, and only those served since the last have moved."""
    ttls = {
        conversation: ttl_s
        for ttl_s, conversations in (stats.get(TTL_KEY) or {}).items()
        for conversation in conversations
    }
    before = before or {}
    sightings = {}
    for conversation, last_seen in (stats.get(REPORT_KEY) or {}).items():
        ttl_s = ttls.get(conversation, 0.0)
        known = before.get(conversation)
        if known is None or known.last_seen != last_seen or known.ttl_s != ttl_s:
            known = Sighting(replica, last_seen, ttl_s)
        sightings[conversation] = known
    return sightings
