"""Engine replicas pushing their prefill load to the routers, for sim_routing.py.

The deployment's push rule (branch `pushdeploy`: each engine replica over the engine channel
it holds to each ingress replica): a change of the replica's prefill ledger (a request
arrives, a first token, an end) is pushed at once if no push went out within the last
``window_s``; otherwise at the end of that window, carrying the load as of then (one push
for every change within the window). Each push reaches the routers ``latency_s`` after it
went out (Ray streaming on a cluster: a few ms). Every ingress replica's channel gets the
same pushes at the same times, so one schedule per engine replica stands for all of them.

`LoadPushes` is the timing alone, in simulated time: the replay tells it each change
(`changed`) and lets it catch up to each event's time first (`advance`), so a push at a
window's end takes the ledger as it was then, before the event that follows. What a push
carries (`ReplicaReporter.load`) and where it goes (`TTFTPredictor.pushed` of every
router) are the two callables it is given.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

Load = dict[str, Any]


class LoadPushes:
    def __init__(
        self,
        latency_s: float,
        window_s: float,
        load_at: Callable[[str, float], Load],
        deliver_at: Callable[[str, Load, float], None],
    ) -> None:
        self.latency_s, self.window_s = latency_s, window_s
        self._load_at, self._deliver_at = load_at, deliver_at
        self._last_sent: dict[str, float] = {}  # replica -> when its latest push went out
        self._pending: set[str] = set()  # replicas with a push due at their window's end
        # (time, order, replica, load): a push going out at the window's end (load None) or
        # reaching the routers (its load), in time order, then in the order scheduled.
        self._due: list[tuple[float, int, str, Load | None]] = []
        self._order = itertools.count()
        self.sent = 0  # pushes that went out (per ingress replica), for the replay's summary

    def changed(self, replica: str, now: float) -> None:
        """The replica's prefill ledger changed at ``now`` (after `advance` to ``now``)."""
        if replica in self._pending:
            return  # the push at the window's end carries it
        last = self._last_sent.get(replica)
        if last is None or now - last >= self.window_s:
            self._send(replica, now)
            return
        self._pending.add(replica)
        self._schedule(last + self.window_s, replica, None)

    def advance(self, now: float) -> None:
        """Every push going out or reaching the routers up to ``now``, in time order."""
        while self._due and self._due[0][0] <= now:
            at, _, replica, load = heapq.heappop(self._due)
            if load is None:
                self._pending.discard(replica)
                self._send(replica, at)
            else:
                self._deliver_at(replica, load, at)

    def _send(self, replica: str, at: float) -> None:
        self._last_sent[replica] = at
        self.sent += 1
        self._schedule(at + self.latency_s, replica, self._load_at(replica, at))

    def _schedule(self, at: float, replica: str, load: Load | None) -> None:
        heapq.heappush(self._due, (at, next(self._order), replica, load))
