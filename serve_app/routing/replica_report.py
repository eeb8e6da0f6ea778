"""Everything an engine replica reports to the routers, in one place.

The engine deployment keeps one `ReplicaReporter` and hands its `report` to Ray Serve as its
routing stats (``record_routing_stats``); the routing simulator keeps one per simulated replica
and reports the same way, so both run this code:

- the conversations served recently (``serve_app.routing.directory``);
- the prefix cache per conversation, from the engine's KV-cache events
  (``serve_app.routing.kv_summary``; `held` is the engine's event sink);
- the queued uncached prefill, the measured prefill rate and the decode load
  (``serve_app.routing.prefill``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from serve_app.routing.directory import ServedConversations
from serve_app.routing.kv_summary import HELD_KEY, KV_EVENTS_KEY, HeldPrefixes
from serve_app.routing.prefill import PrefillLedger


class ReplicaReporter:
    def __init__(self, replica: str, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.served = ServedConversations(replica, clock=clock)
        self.held = HeldPrefixes()
        self.prefills = PrefillLedger()

    def arrived(self, request_id: str, session_id: str | None, prompt_tokens: int) -> None:
        """A request reached the replica: its uncached tokens are its prompt less what the
        replica holds of its conversation (by the KV summary), or, if it holds none of it, less
        the shared prefix such turns found cached (the ledger's `shared_prefix_tokens`)."""
        held = 0
        if session_id:
            self.served.record(session_id)
            held = self.held.held_tokens(session_id)
        if held:
            self.prefills.arrived(request_id, prompt_tokens - held, self._clock())
            return
        shared = min(self.prefills.shared_prefix_tokens or 0, prompt_tokens - 1)
        self.prefills.arrived(request_id, prompt_tokens - shared, self._clock(), prompt_tokens)

    def first_token(self, request_id: str, uncached_tokens: int | None, at: float) -> None:
        self.prefills.first_token(request_id, uncached_tokens, at)

    def ended(self, request_id: str) -> None:
        self.prefills.ended(request_id)

    def now(self) -> float:
        return self._clock()

    def report(self) -> dict[str, Any]:
        return {
            **self.served.report(),
            **self.prefills.report(self._clock()),
            HELD_KEY: self.held.report(),
            KV_EVENTS_KEY: dict(self.held.event_counts),
        }
