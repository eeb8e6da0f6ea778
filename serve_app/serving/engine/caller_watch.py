"""Aborting the engine requests whose caller died (the engine deployment's, deployment.py:
Ray does not cancel a streaming actor task whose caller's process is gone, so the ingress
names its replica actor with each request and `CallerWatch` checks those callers every
``CALLER_CHECK_PERIOD_S``, one GCS call for them all, nothing per token)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import ray

logger = logging.getLogger(__name__)

CALLER_CHECK_PERIOD_S = 2.0


def live_actor_names() -> set[str]:
    """The named actors alive (Serve's replicas among them, by their actor names),
    from the GCS in one call: no dashboard needed. A dead replica's name is released."""
    return {actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)}


class CallerWatch:
    """Aborts the requests whose caller died: the callers of the running requests are checked
    every ``period_s``, while there are any, and a caller ``live_callers`` no longer lists has
    each of its requests ``abort``ed. Nothing is done per request beyond two dict updates."""

    def __init__(
        self,
        abort: Callable[[str], Awaitable[None]],
        live_callers: Callable[[], Awaitable[set[str]]],
        period_s: float = CALLER_CHECK_PERIOD_S,
    ) -> None:
        self._abort = abort
        self._live_callers = live_callers
        self._period_s = period_s
        self._requests: dict[str, set[str]] = {}  # caller -> its running request ids
        self._task: asyncio.Task | None = None

    def add(self, caller: str, request_id: str) -> None:
        self._requests.setdefault(caller, set()).add(request_id)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._watch(), name="engine caller watch")

    def discard(self, caller: str, request_id: str) -> None:
        requests = self._requests.get(caller)
        if requests is not None:
            requests.discard(request_id)
            if not requests:
                del self._requests[caller]

    async def _watch(self) -> None:
        while self._requests:
            await asyncio.sleep(self._period_s)
            callers = set(self._requests)  # before the listing: each was alive when it called
            try:
                alive = await self._live_callers()
            except Exception:  # the GCS unreachable: abort nothing on a guess
                logger.warning("could not list live callers; checked again in %ss", self._period_s)
                continue
            for caller in callers - alive:
                for request_id in self._requests.pop(caller, set()):
                    logger.warning("request %s: its caller %s is gone; aborted", request_id, caller)
                    await self._abort(request_id)
