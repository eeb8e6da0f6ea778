"""The request routers running in this process, for the serving code beside them (an ingress
replica's) to ask about their placements.

It also carries what the serving code learns for the routers: the load an engine replica
pushes over its channel to this ingress (`push_load`), handed to every router here.

A module of its own because Ray Serve ships the request router class by value (cloudpickle,
``register_pickle_by_value`` on its module): state kept in ``router.py``'s globals would be a
copy made for the deserialized class, which no other module could see. Modules the router
imports are shipped by reference, so this one is the process's own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

logger = logging.getLogger(__name__)

# How often `await_reported` looks again: a router's state is read from the caller's event
# loop (Ray runs a handle's router on a loop of its own), so it polls, cheaply.
POLL_S = 0.02


class LocalRouter(Protocol):
    @property
    def report_wait_s(self) -> float: ...

    def placement_reported(self, key: str) -> bool:
        """Whether every router can find where this one last placed conversation ``key``."""
        ...

    @property
    def wants_loads(self) -> bool:
        """Whether it places by the loads the engine replicas push (its ``use_pushed_loads``)."""
        ...

    def push_load(self, replica: str, load: Mapping[str, Any]) -> None:
        """Engine ``replica``'s load (`ReplicaReporter.load`), from another thread than the
        router's own event loop (Ray runs a handle's router on a loop of its own)."""
        ...


_ROUTERS: weakref.WeakSet[LocalRouter] = weakref.WeakSet()  # type: ignore[type-var]
# Routers register on their own loop's thread while the serving code's loop reads the set.
_ROUTERS_LOCK = threading.Lock()


def register(router: LocalRouter) -> None:
    with _ROUTERS_LOCK:
        _ROUTERS.add(router)


def _routers() -> list[LocalRouter]:
    with _ROUTERS_LOCK:
        return list(_ROUTERS)


def wants_loads() -> bool:
    """Whether a router in this process places by pushed loads: the serving code then asks
    each engine replica for its load on the channel it opens (none are sent otherwise)."""
    return any(router.wants_loads for router in _routers())


def push_load(replica: str, load: Mapping[str, Any]) -> None:
    """Hand the load engine ``replica`` pushed to every router in this process that places by
    them (each takes it thread-safely, and applies it before its next choice). A push is
    advice: a router that fails to take it is logged, never the channel's end (its requests
    ride on)."""
    for router in _routers():
        if not router.wants_loads:
            continue
        try:
            router.push_load(replica, load)
        except Exception:
            logger.exception("a router could not take engine replica %s's load", replica)


async def await_reported(key: str) -> bool:
    """Wait until the placement of conversation ``key`` by this process's routers is in the
    engine replicas' reports, so every router (every ingress replica's) sends its next request
    to the same replica. For a request whose next one must find its prefix: a prewarm, whose
    next turn holds no answer of the model's, so another ingress replica's router would take
    it for a new conversation, not wait for reports, and maybe place it elsewhere.

    Bounded by two of the routers' ``report_wait_s`` (a round of reports takes about one):
    False if that ran out; True once reported, or with nothing to wait for (no router here
    placed ``key``, one replica, report waits off)."""
    routers = [router for router in _routers() if not router.placement_reported(key)]
    if not routers:
        return True
    deadline = time.monotonic() + 2 * max(router.report_wait_s for router in routers)
    while routers:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
        routers = [router for router in routers if not router.placement_reported(key)]
    return True
