"""The retention sweep: every ingress replica deletes the store's expired responses
(``store.retention_days``) every ``store.sweep_interval_s``, in transactions of at most
``store.sweep_batch`` responses each. Replicas need not agree on who sweeps: their sweeps may
overlap, each deleting rows the other has not (`SqlResponseStore.sweep_expired`). Reads never
wait for a sweep: an expired response is not found from the moment it expires."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from serve_app.config import StoreConfig
from serve_app.store.base import ResponseStore

logger = logging.getLogger(__name__)


class RetentionSweep:
    def __init__(self, store: ResponseStore, config: StoreConfig) -> None:
        self._store = store
        self._batch = config.sweep_batch
        self._interval_s = config.sweep_interval_s
        self._enabled = config.retention_days is not None
        self._task: asyncio.Task | None = None

    async def sweep(self) -> int:
        """Delete every expired response, one batch per transaction; how many."""
        deleted = 0
        while True:
            swept = await self._store.sweep_expired(self._batch)
            deleted += swept
            if swept < self._batch:
                return deleted
            await asyncio.sleep(0)  # the replica's requests between two batches

    def start(self) -> None:
        if self._enabled and self._task is None:
            self._task = asyncio.create_task(self._sweep_forever(), name="retention sweep")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sweep_forever(self) -> None:
        # Replicas started together sweep at different moments.
        await asyncio.sleep(random.uniform(0, min(self._interval_s, 30)))
        while True:
            try:
                if deleted := await self.sweep():
                    logger.info("retention sweep: %d expired responses deleted", deleted)
            except Exception:
                logger.exception("retention sweep failed")
            await asyncio.sleep(self._interval_s)
