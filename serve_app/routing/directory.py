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
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from serve_app.routing.ring import stable_hash

DEFAULT_IDLE_S = 300.0
# Ray Serve sends every replica's stats to every router whenever one replica's change, so
# reports are kept small: conversations as 64-bit hashes (about 20 bytes each, pickled), and
# past this many per replica the oldest go unreported (routers still place them by the ring).
DEFAULT_MAX_REPORTED = 4096
REPORT_KEY = "conversations"
REPORTED_AT_KEY = "reported_at"

K = TypeVar("K", str, int)


@dataclass(frozen=True)
class Sighting:
    replica: str
    last_seen: float


class ConversationTable(Generic[K]):
    """Where and when each recent conversation was last served.

    Entries are kept in last-seen order, so forgetting those idle for ``idle_s`` pops from the
    front, as does dropping the oldest past ``max_conversations``. A router keeps one by
    routing key; an engine replica one by the key's hash, to report.
    """

    def __init__(self, idle_s: float, max_conversations: int, clock: Callable[[], float]):
        if idle_s <= 0 or max_conversations <= 0:
            raise ValueError("idle_s and max_conversations must be positive")
        self.idle_s = idle_s
        self.max_conversations = max_conversations
        self._clock = clock
        self._homes: OrderedDict[K, Sighting] = OrderedDict()

    def __len__(self) -> int:
        self._forget_idle()
        return len(self._homes)

    def home(self, key: K) -> Sighting | None:
        self._forget_idle()
        return self._homes.get(key)

    def assign(self, key: K, replica: str) -> None:
        """Record that ``key`` is served on ``replica`` now."""
        self._homes.pop(key, None)
        self._homes[key] = Sighting(replica, self._clock())
        while len(self._homes) > self.max_conversations:
            self._homes.popitem(last=False)

    def last_seen(self) -> dict[K, float]:
        self._forget_idle()
        return {key: sighting.last_seen for key, sighting in self._homes.items()}

    def horizon(self) -> float:
        """Conversations last seen before this are idle."""
        return self._clock() - self.idle_s

    def _forget_idle(self) -> None:
        horizon = self.horizon()
        while self._homes and next(iter(self._homes.values())).last_seen < horizon:
            self._homes.popitem(last=False)


class ServedConversations:
    """On an engine replica: the conversations it served within ``idle_s``, to report."""

    def __init__(
        self,
        replica: str,
        idle_s: float = DEFAULT_IDLE_S,
        max_reported: int = DEFAULT_MAX_REPORTED,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.replica = replica
        self._clock = clock
        self._table: ConversationTable[int] = ConversationTable(idle_s, max_reported, clock)

    def record(self, key: str) -> None:
        self._table.assign(stable_hash(key), self.replica)

    def report(self) -> dict[str, Any]:
        """The routing stats this replica hands Ray Serve: each recent conversation's last
        request time, by the hash of its key, and when the report was made."""
        return {REPORT_KEY: self._table.last_seen(), REPORTED_AT_KEY: self._clock()}


@dataclass(frozen=True)
class ConversationDirectory:
    """On a router: every replica's report merged. A conversation reported by several replicas
    (it spilled) belongs to the one that served it last."""

    homes: dict[int, Sighting] = field(default_factory=dict)  # by the key's stable_hash
    active: Counter[str] = field(default_factory=Counter)
    reported_at: dict[str, float] = field(default_factory=dict)  # by replica

    def home(self, key: str) -> Sighting | None:
        return self.homes.get(stable_hash(key))

    def reported_since(self, moment: float) -> bool:
        """Whether every reporting replica's latest report was made at ``moment`` or later, so
        that a conversation served anywhere before then is in this directory."""
        return all(reported_at >= moment for reported_at in self.reported_at.values())

    @classmethod
    def from_reports(cls, reports: Mapping[str, Mapping[str, Any]]) -> ConversationDirectory:
        """``reports`` maps each replica to its routing stats; a replica that reports nothing
        (still starting, or another version during a rollout) contributes nothing."""
        homes: dict[int, Sighting] = {}
        reported_at: dict[str, float] = {}
        for replica, stats in reports.items():
            if REPORTED_AT_KEY in stats:
                reported_at[replica] = stats[REPORTED_AT_KEY]
            for conversation, last_seen in (stats.get(REPORT_KEY) or {}).items():
                known = homes.get(conversation)
                if known is None or last_seen > known.last_seen:
                    homes[conversation] = Sighting(replica, last_seen)
        return cls(homes, Counter(sighting.replica for sighting in homes.values()), reported_at)
