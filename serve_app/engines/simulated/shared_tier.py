"""The simulated engine's shared KV tier on Ray: one store the replicas of an app really share.

On Ray each engine replica is its own actor process, so a `SharedKVTier` per process (what the
in-process tests and the replay share) would give each replica a store only it writes. Here
the store lives in one named Ray actor per app and tier size (`SharedTierStore`, detached so
that removing the replica that created it does not take it away), and each replica holds a
`RemoteSharedKVTier`, a stand-in with the cache's `SharedTier` interface that models a remote
store (LMCache's remote backend, Mooncake) as such:

- a lookup asks the store, in one call, which of the prompt's blocks past the replica's own
  tiers it holds (`prefetch`, awaited when the prompt reaches the head of the prefill queue;
  the time model charges the blocks pulled at the pull rate, not the call's wall time, which
  on a shared host is contention, not the model's);
- writes and LRU refreshes are queued and sent in batches every ``flush_s``, off the request's
  path, as a connector stores asynchronously: a block another replica computed becomes
  visible a flush later. The queue is bounded (``max_pending_keys``): past it the oldest
  batches are dropped, as a store that cannot keep up loses writes, and counted;
- a store that fails or does not answer within ``timeout_s`` is a miss (the prompt is
  computed), logged, never a failed request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

import ray
from ray import serve

from serve_app.engines.prefix_cache import SharedKVTier

logger = logging.getLogger(__name__)

# The namespace of the stores' actors (named per app, `store_name`).
NAMESPACE = "serve_app_shared_kv"

Op = tuple[Literal["write", "touch"], list[int]]


class SharedTierStore:
    """The actor's body: a `SharedKVTier` applying batches of writes and refreshes in the
    order each replica sent them, and answering lookups. A plain class, so its logic is
    tested without Ray; a sync actor runs one call at a time, so each call sees a consistent
    store."""

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        self.tier = SharedKVTier(capacity_tokens, block_size)

    def apply(self, ops: Sequence[Op]) -> int:
        """Apply one replica's queued operations in order; returns the blocks held after."""
        for kind, keys in ops:
            if kind == "write":
                self.tier.write(keys)
            else:
                self.tier.touch(keys)
        return len(self.tier)

    def held(self, keys: Sequence[int]) -> list[int]:
        return self.tier.held(keys)


class RemoteSharedKVTier:
    """One replica's view of a store in another process (the cache's `SharedTier`)."""

    def __init__(
        self,
        store: Any,
        block_size: int,
        flush_s: float = 0.02,
        timeout_s: float = 1.0,
        max_pending_keys: int = 200_000,
    ) -> None:
        # `store` has Ray's actor-handle shape: store.held.remote(keys) and
        # store.apply.remote(ops) return awaitables.
        self._store = store
        self.block_size = block_size
        self.flush_s = flush_s
        self.timeout_s = timeout_s
        self.max_pending_keys = max_pending_keys
        # The keys the store held among those last asked for: `__contains__` answers from it.
        self._held: frozenset[int] = frozenset()
        self._pending: deque[Op] = deque()
        self._pending_keys = 0
        self._flusher: asyncio.Task[None] | None = None
        self.dropped_keys = 0
        self.failed_calls = 0

    def __contains__(self, key: int) -> bool:
        return key in self._held

    def write(self, keys: Sequence[int]) -> None:
        self._queue(("write", list(keys)))

    def touch(self, keys: Sequence[int]) -> None:
        held = [key for key in keys if key in self._held]
        if held:
            self._queue(("touch", held))

    async def prefetch(self, keys: Sequence[int]) -> None:
        try:
            held = await asyncio.wait_for(self._store.held.remote(list(keys)), self.timeout_s)
        except Exception as error:  # a store that is down or late is a miss, not a failure
            self.failed_calls += 1
            logger.warning("shared KV tier lookup failed (%r): computed instead", error)
            held = []
        self._held = frozenset(held)

    def _queue(self, op: Op) -> None:
        self._pending.append(op)
        self._pending_keys += len(op[1])
        while self._pending_keys > self.max_pending_keys and len(self._pending) > 1:
            _, dropped = self._pending.popleft()
            self._pending_keys -= len(dropped)
            self.dropped_keys += len(dropped)
        self._start_flusher()

    def _start_flusher(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop here: the next call from one starts it
        self._flusher = loop.create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        """Send what is queued every ``flush_s`` until the queue is empty."""
        while self._pending:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    async def flush(self) -> None:
        """Send the queued operations in one call, in order."""
        ops = list(self._pending)
        self._pending.clear()
        self._pending_keys = 0
        if not ops:
            return
        try:
            await asyncio.wait_for(self._store.apply.remote(ops), self.timeout_s)
        except Exception as error:  # lost writes: later lookups miss them, as in a real store
            self.failed_calls += 1
            logger.warning("shared KV tier write failed (%r): %d batches lost", error, len(ops))


def store_name(app_name: str, capacity_tokens: int, block_size: int) -> str:
    return f"{app_name}:shared-kv-{capacity_tokens}-{block_size}"


def in_serve_replica() -> str | None:
    """The app's name when this process is a Ray Serve replica, else None."""
    if not ray.is_initialized():
        return None
    try:
        return serve.get_replica_context().app_name
    except Exception:  # RayServeException: not in a replica (a driver, a test)
        return None


def ray_shared_tier(app_name: str, capacity_tokens: int, block_size: int) -> RemoteSharedKVTier:
    """This replica's view of its app's store, the store's actor created by the first
    replica to ask (``get_if_exists`` makes the replicas' concurrent starts agree on one)."""
    actor = (
        ray.remote(SharedTierStore)
        .options(
            name=store_name(app_name, capacity_tokens, block_size),
            namespace=NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0.01,
        )
        .remote(capacity_tokens, block_size)
    )
    return RemoteSharedKVTier(actor, block_size)


def remove_stores(app_name: str) -> int:
    """Kill the app's stores (they are detached: `serve.delete` leaves them); returns how
    many. For a driver that deletes an app and runs another in the same cluster."""
    removed = 0
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == NAMESPACE and actor["name"].startswith(f"{app_name}:"):
            ray.kill(ray.get_actor(actor["name"], namespace=NAMESPACE))
            removed += 1
    return removed
