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
    ``active_since`` (None: none is left out)."""

    homes: dict[int, Sighting] = field(default_factory=dict)  # by the key's stable_hash
    active: Counter[str] = field(default_factory=Counter)
    reported_at: dict[str, float] = field(default_factory=dict)  # by replica
    active_since: float | None = None

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
