"""Everything an engine replica reports to the routers, in one place.

The engine deployment keeps one `ReplicaReporter` and hands its `report` to Ray Serve as its
routing stats (``record_routing_stats``); the routing simulator keeps one per simulated replica
and reports the same way, so both run this code:

- the conversations served recently, or kept by their prompt-cache ttl
  (``serve_app.routing.directory``);
- the prefix cache per conversation, from the engine's KV-cache events
  (``serve_app.routing.kv_summary``; `held` is the engine's event sink): ``held_tokens`` on the
  GPU, ``cpu_held_tokens`` held only in the replica's CPU tier (a turn reloads those instead
  of computing them), each per conversation, same keys and bound;
- ``kv_load_tokens_per_s``: how fast the replica loads KV from its CPU tier to its GPU (the
  engine's configured or measured rate; absent for an engine with no CPU tier);
- the queued uncached prefill, the measured prefill rate and the decode load
  (``serve_app.routing.prefill``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from serve_app.routing.directory import REPORTED_AT_KEY, ServedConversations
from serve_app.routing.kv_summary import CPU_HELD_KEY, HELD_KEY, KV_EVENTS_KEY, HeldPrefixes
from serve_app.routing.prefill import PrefillLedger

# The routing-stats keys a router reads of the prefix cache (the others: directory, prefill).
__all__ = ["CPU_HELD_KEY", "HELD_KEY", "KV_EVENTS_KEY", "KV_LOAD_RATE_KEY", "ReplicaReporter"]

# CPU -> GPU KV load rate of the replica, tokens/s (absent: the replica has no CPU tier).
KV_LOAD_RATE_KEY = "kv_load_tokens_per_s"


class ReplicaReporter:
    def __init__(
        self,
        replica: str,
        clock: Callable[[], float] = time.time,
        kv_load_tokens_per_s: float | None = None,
    ) -> None:
        self._clock = clock
        # The engine's CPU -> GPU load rate (None: no CPU tier, or not known).
        self.kv_load_tokens_per_s = kv_load_tokens_per_s
        self.served = ServedConversations(replica, clock=clock)
        self.held = HeldPrefixes()
        self.prefills = PrefillLedger()

    def arrived(
        self,
        request_id: str,
        session_id: str | None,
        prompt_tokens: int,
        ttl_s: float | None = None,
        *,
        deadline_s: float = 0.0,
        priority: int = 0,
    ) -> None:
        """A request reached the replica (asking its prefix kept ``ttl_s``, reported with its
        conversation: ``directory.py``): its uncached tokens are its prompt less what the
        replica holds of its conversation (by the KV summary, on the GPU or, at its load cost,
        in the CPU tier), or, if it holds none of it, less the shared prefix such turns found
        cached (the ledger's `shared_prefix_tokens`). ``deadline_s`` and ``priority``: its
        scheduling (issue 49), for the queue ahead of each rank."""
        held = on_cpu = 0
        if session_id:
            self.served.record(session_id, ttl_s)
            held = self.held.held_tokens(session_id)
            on_cpu = self.held.cpu_held_tokens(session_id)
        if held or on_cpu:
            loaded = min(on_cpu, max(prompt_tokens - held, 0))  # what the prompt needs of it
            uncached = max(prompt_tokens - held - loaded, 0) + self._load_cost(loaded)
            self.prefills.arrived(
                request_id, uncached, self._clock(), deadline_s=deadline_s, priority=priority
            )
            return
        shared = min(self.prefills.shared_prefix_tokens or 0, prompt_tokens - 1)
        self.prefills.arrived(
            request_id,
            prompt_tokens - shared,
            self._clock(),
            prompt_tokens,
            deadline_s=deadline_s,
            priority=priority,
        )

    def _load_cost(self, tokens: int) -> int:
        """Loading ``tokens`` from the CPU tier, in prefill tokens of the same time: the
        engine loads them in the request's turn of the prefill queue, so the requests behind
        wait for the load as for a prefill. Free until the prefill rate is measured."""
        rate, load_rate = self.prefills.tokens_per_s, self.kv_load_tokens_per_s
        if not tokens or rate is None or not load_rate:
            return 0
        return round(tokens * rate / load_rate)

    def first_token(self, request_id: str, uncached_tokens: int | None, at: float) -> None:
        self.prefills.first_token(request_id, uncached_tokens, at)

    def ended(self, request_id: str) -> bool:
        """Whether the ledger held it (a request's end may be told twice)."""
        return self.prefills.ended(request_id)

    def now(self) -> float:
        return self._clock()

    def load(self) -> dict[str, Any]:
        """What the replica pushes to every ingress replica's router as its prefill queue
        changes (over the engine channel; `TTFTPredictor.pushed`): its queued prefill, rate
        and decode load as of now, without the report's conversations and prefix summary."""
        return {**self.prefills.report(self._clock()), REPORTED_AT_KEY: self._clock()}

    def report(self) -> dict[str, Any]:
        report = {
            **self.served.report(),
            **self.prefills.report(self._clock()),
            HELD_KEY: self.held.report(),
            KV_EVENTS_KEY: dict(self.held.event_counts),
        }
        cpu_held = self.held.cpu_report()
        if cpu_held:
            report[CPU_HELD_KEY] = cpu_held
        if self.kv_load_tokens_per_s is not None:
            report[KV_LOAD_RATE_KEY] = self.kv_load_tokens_per_s
        return report
