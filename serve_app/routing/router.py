"""The engine deployment's request router: prompt_cache_key affinity with bounded load.

Ray Serve calls `choose_replicas` for each request on the caller's side (inside the ingress
replica that holds the engine handle). The routing key is the request's ``session_id``, which
the ingress sets to the ``prompt_cache_key`` (or a hash of the prompt's start). Where each
conversation goes is `serve_app.routing.affinity.ConversationPlacer`'s choice, pure computation
over the router's own queue-length view and the engine replicas' routing stats (the
conversations each serves, ``serve_app.routing.directory``), both of which Ray Serve delivers
to the router: no remote call on the router's event loop, only one short bounded wait
(`PrefixAffinityRouter._await_reports_for`), which never holds every routing task.

Only Ray Serve's public `RequestRouter` surface is used: ``curr_replicas``,
``replica_queue_len_cache`` and ``max_num_routing_tasks``.

Configure it in the Serve config (``request_router_kwargs`` are the placer's keyword arguments
and ``report_wait_s``):

    request_router_config:
      request_router_class: serve_app.routing.router.PrefixAffinityRouter
      request_router_kwargs: {load_factor: 1.25, spill_factor: 2.0, min_bound: 16,
                              ttft_slack_s: 0.05, report_wait_s: 1}
      request_routing_stats_period_s: 1

With a KV tier the engine replicas share (LMCache, Mooncake), ``shared_kv_pull_tokens_per_s``
(its pull rate) lets the placer price a moved turn's prefix at a pull (docs/routing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from serve_app.engines.base import GenerateRequest
from serve_app.routing import local_routers, metrics
from serve_app.routing.affinity import ConversationPlacer
from serve_app.routing.keys import continues_conversation, key_digest

logger = logging.getLogger(__name__)

# Replicas tried after the chosen one when it turns the request away (it is full).
MAX_FALLBACKS = 2
# A wait normally ends within one round of reports, about one request_routing_stats_period_s
# (1 s in the configs): each replica reports every 0.9 to 1.1 periods, then the controller
# hands the reports on. This bounds it when reports are late, at one period: it holds one
# routing task meanwhile, never all. configs/local.yaml allows two (a loaded 2-core box).
DEFAULT_REPORT_WAIT_S = 1.0


class PrefixAffinityRouter(RequestRouter):
    """Conversation affinity over ``session_id``: a home replica per conversation, placed
    and spilled by consistent hashing with bounded loads (``serve_app.routing.affinity``)."""

    def initialize_state(
        self,
        report_wait_s: float = DEFAULT_REPORT_WAIT_S,
        use_pushed_loads: bool = False,
        **options: Any,
    ) -> None:
        # The placer's keyword arguments are the router's options; unknown ones are a TypeError
        # at deploy time, not a silent default.
        self._placer = ConversationPlacer(**options)
        if report_wait_s < 0:
            raise ValueError("report_wait_s must not be negative")
        self._report_wait_s = report_wait_s
        # Place by the loads the engine replicas push over their channels as their queues
        # change (docs/routing.md, "Pushed load"), not by their reports' alone. Off by
        # default: it pays where a move is cheap (a KV tier), and without one it evens work
        # less (the replay where prefills queue: 1.15 against 1.11).
        self._use_pushed_loads = use_pushed_loads
        # Set (and replaced) on every routing-stats broadcast: wakes requests waiting for one.
        self._reports_arrived = asyncio.Event()
        # Requests now waiting for reports, each holding one of Ray's routing tasks.
        self._waiting = 0
        # Loads the engine replicas pushed (`push_load`, from the ingress's event loop), the
        # latest of each, until this router's next choice applies them on its own loop.
        self._pushes_lock = threading.Lock()
        self._pushes: dict[str, Mapping[str, Any]] = {}
        self._superseded = 0
        # Serving code beside this router asks it about placements through `local_routers`
        # (not a global of this module: Ray ships this class by value, globals and all).
        local_routers.register(self)
        logger.info(
            "PrefixAffinityRouter: %s, report_wait_s %s, use_pushed_loads %s",
            options or "defaults",
            report_wait_s,
            use_pushed_loads,
        )

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        # The ring spans every running replica, not just those with room right now, so a
        # momentarily full replica does not remap its keys.
        self._placer.set_members(replica.replica_id.unique_id for replica in replicas)
        # Ray Serve calls this again whenever a replica's routing stats change: each engine
        # replica reports the conversations it serves, so this router learns where the other
        # ingress replicas' routers placed them.
        reports = {replica.replica_id.unique_id: replica.routing_stats for replica in replicas}
        self._placer.set_reports(reports)
        metrics.record_reported_conversations(reports, self._placer.directory.active)
        # Here too, not only per request: a replica that left drops out of the gauge now.
        metrics.record_loads(self._loads())
        self._reports_arrived.set()
        self._reports_arrived = asyncio.Event()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        pinned = _pinned_replica(pending_request)
        if pinned is not None:
            # A channel call (serve_app.serving.engine.channel) goes to the replica it names;
            # if that one is gone, anywhere: the replica there ends it at once.
            return [[by_id.get(pinned) or candidate_replicas[0]]]
        key = pending_request.metadata.session_id if pending_request is not None else None
        if key and pending_request is not None and len(by_id) > 1:
            # With one candidate there is nothing to choose: no wait.
            await self._await_reports_for(key, pending_request)
        self._apply_pushes()
        loads = self._loads()
        metrics.record_loads(loads)
        if not key:
            metrics.ROUTING_DECISIONS.labels("no_key").inc()
            least_loaded = min(by_id, key=lambda unique_id: loads.get(unique_id, 0))
            return [[by_id[least_loaded]]]
        request = _generate_request(pending_request)
        prompt = request.prompt_token_ids if request else None
        # Ray asks again for a request its first choice turned away: counted once.
        request_id = pending_request.metadata.internal_request_id
        # The prompt-cache ttl the request asked: the conversation keeps its home that long.
        ttl_s = request.cache_ttl_s if request else None
        # Its service tier's rank: placed by the queue it would not pass (issue 49).
        priority = request.priority if request else None
        choice = self._placer.choose(
            key, loads, len(prompt) if prompt else None, request_id, ttl_s=ttl_s, priority=priority
        )
        # The candidates in ring order from the key: fallbacks, or the walk when the chosen
        # replica is full or not yet known to the ring.
        ranked = [unique_id for unique_id in self._placer.ring.walk(key) if unique_id in by_id]
        if choice is None or choice.replica not in by_id:
            metrics.ROUTING_DECISIONS.labels("spilled").inc()
            return [
                [by_id[unique_id]] for unique_id in (ranked or list(by_id))[: 1 + MAX_FALLBACKS]
            ]
        metrics.record_decision(choice)
        fallbacks = [unique_id for unique_id in ranked if unique_id != choice.replica]
        return [[by_id[unique_id]] for unique_id in [choice.replica, *fallbacks[:MAX_FALLBACKS]]]

    async def _await_reports_for(self, key: str, pending_request: PendingRequest) -> None:
        """For a later turn of a conversation no router has told this one about: wait, a
        moment, for the engine replicas' reports to name it.

        One wait, never a call: such a turn (its prompt holds the model's earlier messages) was
        most likely placed a moment ago by another ingress replica's router, not yet reported.
        Placing it now could pick another replica (the counts behind balanced placement may
        have moved since), a whole prefill lost. So the request waits until a report names the
        conversation, or every replica has reported after the turn arrived (none served it),
        or ``report_wait_s`` passes (1 s; a round takes about one
        ``request_routing_stats_period_s``, 1 s in the configs).

        The wait holds one of Ray's routing tasks, and Ray runs at most
        ``max_num_routing_tasks`` of them (twice the replicas): all of them waiting would stall
        every request this ingress replica routes. So at most all but one wait at once; a turn
        beyond that is placed at once, as new (``REPORT_WAITS{outcome="skipped"}``).
        Turns of known conversations and first turns never wait; a conversation resumed after
        ``idle_s`` waits once. ``report_wait_s: 0`` turns it off (one ingress replica has
        nothing to wait for)."""
        if (
            self._report_wait_s <= 0
            or self._placer.knows(key)
            or not continues_conversation(_prompt_token_ids(pending_request))
        ):
            return
        if self._waiting >= self.max_num_routing_tasks - 1:
            metrics.REPORT_WAITS.labels("skipped").inc()
            return
        self._waiting += 1
        try:
            outcome = await self._wait_for_reports(key, pending_request.created_at)
        finally:
            self._waiting -= 1
        if outcome == "timed_out":
            logger.warning(
                "no round of routing-stats reports within %.1f s; placing conversation %s as new",
                self._report_wait_s,
                key_digest(key),
            )
        metrics.REPORT_WAITS.labels(outcome).inc()

    async def _wait_for_reports(self, key: str, arrived_at: float) -> str:
        """Wait for reports naming ``key``, or a whole round of them since ``arrived_at``."""
        deadline = time.monotonic() + self._report_wait_s
        while not self._placer.knows(key):
            if self._placer.directory.reported_since(arrived_at):
                return "unknown"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timed_out"
            # A broadcast replaces the event after setting it; this waits on the current one.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # not wait_for: see engine/channel.py
                    await self._reports_arrived.wait()
        return "found"

    def placement_reported(self, key: str) -> bool:
        """Whether every router can find where this one last placed ``key``: the replicas'
        reports (which every router receives alike) name that replica as its home. True for a
        conversation this router did not place, or with report waits off."""
        placed = self._placer.table.home(key)
        if placed is None or self._report_wait_s <= 0 or len(self.curr_replicas) <= 1:
            return True
        reported = self._placer.directory.home(key)
        return reported is not None and reported.replica == placed.replica

    @property
    def wants_loads(self) -> bool:
        return self._use_pushed_loads

    def push_load(self, replica: str, load: Mapping[str, Any]) -> None:
        """Engine ``replica``'s load pushed over its channel to this ingress
        (``serve_app.serving.engine.channel``). Called on the ingress's event loop, not this
        router's: kept under a lock, the latest per replica, for the next choice to apply."""
        with self._pushes_lock:
            if replica in self._pushes:
                self._superseded += 1
            self._pushes[replica] = load

    def _apply_pushes(self) -> None:
        """Give the predictor the loads pushed since the last choice (on this router's loop,
        as every other use of the placer)."""
        with self._pushes_lock:
            pushes, self._pushes = self._pushes, {}
            superseded, self._superseded = self._superseded, 0
        if not pushes and not superseded:
            return
        applied = sum(
            self._placer.predictor.pushed(replica, load) for replica, load in pushes.items()
        )
        metrics.record_pushed(applied, len(pushes) - applied, superseded)

    @property
    def report_wait_s(self) -> float:
        return self._report_wait_s

    def _loads(self) -> dict[str, int]:
        """Ongoing requests per replica, as this router last saw them (missing counts as 0)."""
        cache = self.replica_queue_len_cache
        return {
            replica_id.unique_id: cache.get(replica_id) or 0 for replica_id in self.curr_replicas
        }


def _pinned_replica(pending_request: PendingRequest | None) -> str | None:
    """The engine replica a ``channel`` call asks for; other calls name none."""
    if pending_request is None or pending_request.metadata.call_method != "channel":
        return None
    return pending_request.kwargs.get("replica")


def _generate_request(pending_request: PendingRequest) -> GenerateRequest | None:
    """The request of an engine ``generate`` call; other method calls have none."""
    request = pending_request.args[0] if pending_request.args else None
    return request if isinstance(request, GenerateRequest) else None


def _prompt_token_ids(pending_request: PendingRequest) -> list[int]:
    """The prompt of an engine ``generate`` call; other method calls have none."""
    request = _generate_request(pending_request)
    return request.prompt_token_ids if request else []
