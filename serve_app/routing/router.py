"""The engine deployment's request router: prompt_cache_key affinity with bounded load.

Ray Serve calls `choose_replicas` for each request on the caller's side (inside the ingress
replica that holds the engine handle). The routing key is the request's ``session_id``, which
the ingress sets to the ``prompt_cache_key`` (or a hash of the prompt's start). Where each
conversation goes is `serve_app.routing.affinity.ConversationPlacer`'s choice, pure computation
over the router's own queue-length view and the engine replicas' routing stats (the
conversations each serves, ``serve_app.routing.directory``), both of which Ray Serve delivers
to the router: no remote call on the router's event loop. Configure it in the Serve config
(``request_router_kwargs`` are the placer's keyword arguments):

    request_router_config:
      request_router_class: serve_app.routing.router.PrefixAffinityRouter
      request_router_kwargs: {load_factor: 1.25, spill_factor: 2.0, min_bound: 8}
      request_routing_stats_period_s: 1
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve._private.request_router.common import PendingRequest
from ray.serve._private.request_router.replica_wrapper import RunningReplica
from ray.serve._private.request_router.request_router import RequestRouter

from serve_app.routing import metrics
from serve_app.routing.affinity import ConversationPlacer
from serve_app.routing.directory import ConversationDirectory

logger = logging.getLogger(__name__)

# Replicas tried after the chosen one when it turns the request away (it is full).
MAX_FALLBACKS = 2


class PrefixAffinityRouter(RequestRouter):
    """Conversation affinity over ``session_id``: a home replica per conversation, placed
    and spilled by consistent hashing with bounded loads (``serve_app.routing.affinity``)."""

    def initialize_state(self, **options: Any) -> None:
        # The placer's keyword arguments are the router's options; unknown ones are a TypeError
        # at deploy time, not a silent default.
        self._placer = ConversationPlacer(**options)
        logger.info("PrefixAffinityRouter: %s", options or "defaults")

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        # The ring spans every running replica, not just those with room right now, so a
        # momentarily full replica does not remap its keys.
        self._placer.set_members(replica.replica_id.unique_id for replica in replicas)
        # Ray Serve calls this again whenever a replica's routing stats change: each engine
        # replica reports the conversations it serves, so this router learns where the other
        # ingress replicas' routers placed them.
        reports = {replica.replica_id.unique_id: replica.routing_stats for replica in replicas}
        directory = ConversationDirectory.from_reports(reports)
        self._placer.set_directory(directory)
        metrics.record_reported_conversations(reports, directory.active)

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
        loads = self._loads()
        metrics.record_loads(loads)
        key = pending_request.metadata.session_id if pending_request is not None else None
        if not key:
            metrics.ROUTING_DECISIONS.labels("no_key").inc()
            least_loaded = min(by_id, key=lambda unique_id: loads.get(unique_id, 0))
            return [[by_id[least_loaded]]]
        choice = self._placer.choose(key, loads)
        # The candidates in ring order from the key: fallbacks, or the walk when the chosen
        # replica is full or not yet known to the ring.
        ranked = [unique_id for unique_id in self._placer.ring.walk(key) if unique_id in by_id]
        if choice is None or choice.replica not in by_id:
            metrics.ROUTING_DECISIONS.labels("spilled").inc()
            return [
                [by_id[unique_id]] for unique_id in (ranked or list(by_id))[: 1 + MAX_FALLBACKS]
            ]
        metrics.ROUTING_DECISIONS.labels("spilled" if choice.spilled else "owner").inc()
        fallbacks = [unique_id for unique_id in ranked if unique_id != choice.replica]
        return [[by_id[unique_id]] for unique_id in [choice.replica, *fallbacks[:MAX_FALLBACKS]]]

    def _loads(self) -> dict[str, int]:
        """Ongoing requests per replica, as this router last saw them (missing counts as 0)."""
        loads = {}
        for replica_id in self._replicas:
            queue_len = self._replica_queue_len_cache.get(replica_id)
            loads[replica_id.unique_id] = queue_len or 0
        return loads
