"""The engine replica's tier gate (issue 49): at most ``service_tiers.max_running[tier]`` of a
tier's requests in the engine at once; the rest wait here, in arrival order.

An engine schedules its waiting requests by deadline, but does not take a running request's
place for a waiting one: vLLM admits a waiting request into its batch only when a sequence slot
(``max_num_seqs``) and KV blocks are free, and preempts only to let running requests grow (the
lowest priority first); the simulated engine's decode slots likewise. So a flood of flex
requests that fills the batch makes a priority turn wait for a flex request to end. Capping the
flood's share keeps room for the other tiers; the flood still runs, at that width.

A request held here enters the engine with ``deadline_s`` less its wait, so its deadline still
counts from its arrival at the replica: the engines' aging, and the bound on how long flex is
passed by the other tiers, are unchanged (flex waits here only behind flex).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace

from serve_app.engines.base import GenerateRequest
from serve_app.protocol.service_tiers import tier_of


class TierGate:
    def __init__(self, limits: Mapping[str, int]) -> None:
        # One FIFO semaphore per capped tier (asyncio's wakes its waiters in order).
        self._slots = {tier: asyncio.Semaphore(limit) for tier, limit in limits.items()}
        self._waiting = 0

    def waiting(self) -> int:
        """Requests held here now (load the engine does not count yet)."""
        return self._waiting

    @contextlib.asynccontextmanager
    async def admitted(self, request: GenerateRequest) -> AsyncIterator[GenerateRequest]:
        """``request`` once its tier has room in the engine, as the engine should get it (its
        deadline less the wait here); the room is held until the block exits."""
        slots = self._slots.get(tier_of(request.priority) or "")
        if slots is None:
            yield request
            return
        arrived = time.monotonic()
        self._waiting += 1
        try:
            await slots.acquire()
        finally:
            self._waiting -= 1
        try:
            waited = time.monotonic() - arrived
            yield replace(request, deadline_s=request.deadline_s - waited) if waited else request
        finally:
            slots.release()
