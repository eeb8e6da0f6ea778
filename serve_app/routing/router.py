"""The engine deployment's request router: prompt_cache_key affinity with bounded load.

Ray Serve calls `choose_replicas` for each request on the caller's side (inside the ingress
replica that holds the engine handle). The routing key is the request's ``session_id``, which
the ingress sets to the ``prompt_cache_key`` (or a hash of the prompt's start). Where each
conversation goes is `serve_app.routing.affinity.ConversationPlacer`'s choice, pure computation
over the router's own queue-length view and the engine replicas' routing stats (the
conversations each serves, ``serve_app.routing.directory``), both of which Ray Serve delivers
to the router: no remote call on the router's event loop, only one bounded wait
(`PrefixAffinityRouter._await_reports_for`).

Configure it in the Serve config (``request_router_kwargs`` are the placer's keyword arguments
and ``report_wait_s``):

    request_router_config:
      request_router_class: serve_app.routing.router.PrefixAffinityRouter
      request_router_kwargs: {load_factor: 1.25, spill_factor: 2.0, min_bound: 16}
      request_routing_stats_period_s: 1
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from serve_app.engines.base import GenerateRequest
from serve_app.routing import metrics
from serve_app.routing.affinity import ConversationPlacer
from serve_app.routing.directory import ConversationDirectory
from serve_app.routing.keys import continues_conversation, key_digest

logger = logging.getLogger(__name__)

# Replicas tried after the chosen one when it turns the request away (it is full).
MAX_FALLBACKS = 2
DEFAULT_REPORT_WAIT_S = 3.0


class PrefixAffinityRouter(RequestRouter):
    """Conversation affinity over ``session_id``: a home replica per conversation, placed
    and spilled by consistent hashing with bounded loads (``serve_app.routing.affinity``)."""

    def initialize_state(
        self, report_wait_s: float = DEFAULT_REPORT_WAIT_S, **options: Any
    ) -> None:
        # The placer's keyword arguments are the router's options; unknown ones are a TypeError
        # at deploy time, not a silent default.
        self._placer = ConversationPlacer(**options)
        if report_wait_s < 0:
            raise ValueError("report_wait_s must not be negative")
        self._report_wait_s = report_wait_s
        # Set (and replaced) on every routing-stats broadcast: wakes requests waiting for one.
        self._reports_arrived = asyncio.Event()
        logger.info(
            "PrefixAffinityRouter: %s, report_wait_s %s", options or "defaults", report_wait_s
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
        directory = ConversationDirectory.from_reports(reports)
        self._placer.set_directory(directory)
        metrics.record_reported_conversations(reports, directory.active)
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
            # A channel call (serve_app.serving.engine_channel) goes to the replica it names;
            # if that one is gone, anywhere: the replica there ends it at once.
            return [[by_id.get(pinned) or candidate_replicas[0]]]
        key = pending_request.metadata.session_id if pending_request is not None else None
        if key and pending_request is not None:
            await self._await_reports_for(key, pending_request)
        loads = self._loads()
        metrics.record_loads(loads)
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
        metrics.record_decision(choice)
        fallbacks = [unique_id for unique_id in ranked if unique_id != choice.replica]
        return [[by_id[unique_id]] for unique_id in [choice.replica, *fallbacks[:MAX_FALLBACKS]]]

    async def _await_reports_for(self, key: str, pending_request: PendingRequest) -> None:
        """For a later turn of a conversation no router has told this one about: wait for
        every engine replica to report after the turn arrived.

        One wait, never a call: such a turn (its prompt holds the model's earlier messages) was
        most likely placed a moment ago by another ingress replica's router, not yet reported.
        Placing it now could pick another replica (the counts behind balanced placement may
        have moved since), a whole prefill lost. So the request waits, at most
        ``report_wait_s`` (3 s), for a round of reports made after it arrived, which names the
        replica if any served the conversation: about one ``request_routing_stats_period_s``.
        Turns of known conversations and first turns never wait; a conversation resumed after
        ``idle_s`` waits once. ``report_wait_s: 0`` turns it off (one ingress replica has
        nothing to wait for)."""
        if (
            self._report_wait_s <= 0
            or self._placer.knows(key)
            or not continues_conversation(_prompt_token_ids(pending_request))
        ):
            return
        deadline = time.monotonic() + self._report_wait_s
        while not self._placer.directory.reported_since(pending_request.created_at):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logger.warning(
                    "no round of routing-stats reports within %.1f s; placing conversation %s "
                    "as new",
                    self._report_wait_s,
                    key_digest(key),
                )
                metrics.REPORT_WAITS.labels("timed_out").inc()
                return
            # A broadcast replaces the event after setting it; this waits on the current one.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reports_arrived.wait(), remaining)
        metrics.REPORT_WAITS.labels("found" if self._placer.knows(key) else "unknown").inc()

    def _loads(self) -> dict[str, int]:
        """Ongoing requests per replica, as this router last saw them (missing counts as 0)."""
        loads = {}
        for replica_id in self._replicas:
            queue_len = self._replica_queue_len_cache.get(replica_id)
            loads[replica_id.unique_id] = queue_len or 0
        return loads


def _pinned_replica(pending_request: PendingRequest | None) -> str | None:
    """The engine replica a ``channel`` call asks for; other calls name none."""
    if pending_request is None or pending_request.metadata.call_method != "channel":
        return None
    return pending_request.kwargs.get("replica")


def _prompt_token_ids(pending_request: PendingRequest) -> list[int]:
    """The prompt of an engine ``generate`` call; other method calls have none."""
    request = pending_request.args[0] if pending_request.args else None
    return request.prompt_token_ids if isinstance(request, GenerateRequest) else []
