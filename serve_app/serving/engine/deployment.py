"""The engine deployment: one engine per replica, token ids in, token ids out.

A request whose caller is gone is aborted (its KV freed) within seconds. A client that leaves
cancels its handle call, which cancels the stream here. But when the caller's process dies
(an ingress replica killed, or its node lost), nothing cancels it: Serve runs a streaming
handle call as an actor task (a streaming generator) and Ray does not cancel a running actor
task whose caller died: the executor reports each yield to the caller asynchronously, a
failed report does not stop it, and it "continues running user code until the generator
finishes or the task is cancelled separately" (Ray's streaming generator internals doc). On
the test app, an engine request whose ingress replica was killed was still running 25 s later
(the issue saw such turns run to their end, 60 s each, holding their KV). So the ingress sends
its replica actor's name with each request, and `CallerWatch` checks the callers of the
running requests every ``CALLER_CHECK_PERIOD_S`` (one GCS call for them all, nothing per
token) and aborts the requests of those no longer alive, and closes their channels.

A request's chunks go back on its own stream, or, once its caller has a channel open here
(`channel`), on that channel with the chunks of the caller's other requests
(``serve_app.serving.engine.channel``). Every open channel also carries the replica's load as
its prefill ledger changes (`EngineDeployment._ledger_changed`), for every ingress's router.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ray import serve

from serve_app.config import EngineConfig, ServiceTierArgs, StreamingArgs
from serve_app.engines.base import (
    SERVER_ERROR,
    Engine,
    GenerateChunk,
    GenerateRequest,
    error_chunk,
)
from serve_app.engines.factory import make_engine
from serve_app.protocol.service_tiers import tier_of
from serve_app.routing.replica_report import ReplicaReporter
from serve_app.serving import logs, metrics
from serve_app.serving.engine.autoscaling import GENERATING_REQUESTS, TIERS, tier_metric
from serve_app.serving.engine.caller_watch import (
    CALLER_CHECK_PERIOD_S,
    CallerWatch,
    live_actor_names,
)
from serve_app.serving.engine.channel import (
    CHANNEL_IDLE_S,
    ChannelClosed,
    ChannelSend,
    OnChannel,
    Outbox,
)
from serve_app.serving.engine.liveness import HEARTBEAT, HEARTBEAT_S, Accepted, Heartbeat
from serve_app.serving.engine.tier_gate import TierGate

logger = logging.getLogger(__name__)

# CallerWatch keys of channels (request ids never start so): a dead caller's channel closes.
_CHANNEL = "channel:"
# After a chunk is sent, the next is sent no sooner than the stream window
# (`StreamingArgs.window_s`): tokens arriving meanwhile ride together. At decode rates of 50-200
# tokens/s per request the queue-based coalescing alone nearly never finds two tokens queued
# (bench_stream.py: 1.04-1.15 tokens per chunk). This is its value for a replica built without
# app args (the tests' bare replicas, which may set it); a deployed replica takes the app's.
STREAM_WINDOW_S = StreamingArgs().resolved().window_s


def _tier_label(request: GenerateRequest) -> str:
    """The service tier of an engine request, by its rank ("other": a rank no tier has)."""
    return tier_of(request.priority) or "other"


@dataclass(frozen=True, slots=True)
class _End:
    """The last item of a request's own queue: its producer is done (the engine finished, its
    error chunk was sent, or it was cancelled). Nothing follows it."""


_END = _End()
# What a request's own queue holds: its chunks (tokens, a finish, an error chunk), then `_END`.
# `_Route.send` takes chunks only and `_produce` hands it nothing else; anything else found
# there fails that request alone (`_Route.failure`), never the channel or its other requests.
RouteItem = GenerateChunk | _End


class _Route:
    """Where a request's chunks go: its own stream's queue, until `move_to` a channel."""

    __slots__ = ("_outbox", "_replica", "failed", "queue", "request_id")

    def __init__(self, request_id: str, replica: str) -> None:
        self.request_id = request_id
        self.queue: asyncio.Queue[RouteItem] = asyncio.Queue()
        self._outbox: Outbox | None = None
        self._replica: str | None = replica  # stamped on the first chunk, then None
        self.failed = False  # an unexpected item ended it: nothing more is sent

    def send(self, chunk: GenerateChunk, first_token: bool) -> None:
        if self.failed:
            return  # its error chunk was its last
        if self._replica is not None:
            chunk.replica, self._replica = self._replica, None
        if self._outbox is None:
            self.queue.put_nowait(chunk)
        else:
            self._outbox.put(self.request_id, chunk, urgent=first_token)

    async def next_chunk(
        self, heartbeat_s: float = HEARTBEAT_S
    ) -> GenerateChunk | Heartbeat | None:
        """The own stream's next chunk: all that is queued merged into one, up to a finish
        (None: the producer ended without one). An unexpected item ends it with an error.
        `HEARTBEAT` if nothing came for ``heartbeat_s`` (``serve_app.serving.engine.liveness``)."""
        if self.queue.empty():
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for may swallow a cancellation
            # that comes as its timeout fires, and the request would never be aborted.
            try:
                async with asyncio.timeout(heartbeat_s):
                    first = await self.queue.get()
            except TimeoutError:
                return HEARTBEAT
        else:
            first = self.queue.get_nowait()
        match first:
            case GenerateChunk() as chunk:
                pass
            case _End():
                return None
            case unexpected:
                return self.failure(unexpected)
        while not self.queue.empty() and chunk.finish_reason is None:
            match self.queue.get_nowait():
                case GenerateChunk() as following:
                    chunk = chunk.merge(following)
                case _End():
                    self.queue.put_nowait(_END)  # for the next call
                    break
                case unexpected:
                    return chunk.merge(self.failure(unexpected))
        return chunk

    def move_to(self, outbox: Outbox, producer: asyncio.Task) -> None:
        """Send the chunks the own stream has not sent yet, and all that follow, on
        ``outbox``'s channel (in order: its marker goes out on the own stream first).
        An unexpected item ends the request there with an error and stops its producer."""
        self._outbox = outbox
        outbox.requests[self.request_id] = producer
        while not self.queue.empty():
            # These have waited a window already: no new wait.
            match self.queue.get_nowait():
                case GenerateChunk() as chunk:  # tokens, a finish or an engine's error chunk
                    outbox.put(self.request_id, chunk, urgent=True)
                case _End():  # the producer is done: `_ride` finds it so
                    pass
                case unexpected:
                    outbox.put(self.request_id, self.failure(unexpected), urgent=True)
                    producer.cancel()  # `_ride` then reports it unfinished: the engine aborts
                    return

    def failure(self, item: object) -> GenerateChunk:
        """The last chunk of a request whose queue held ``item``, neither a chunk nor its end
        (a bug, logged): a ``server_error`` for that request alone."""
        logger.error(
            "request %s: its queue held a %s, not a chunk or its end; the request fails",
            self.request_id,
            type(item).__name__,
        )
        self.failed = True
        return GenerateChunk(
            finish_reason="error",
            error="internal error in the engine replica",
            error_code=SERVER_ERROR,
        )


@serve.deployment(name="EngineDeployment", max_ongoing_requests=64)
class EngineDeployment:
    async def __init__(
        self,
        engine: EngineConfig,
        streaming: StreamingArgs | None = None,
        tiers: ServiceTierArgs | None = None,
    ) -> None:
        logs.route_to_replica_log()  # the app's lines in this replica's Serve log file
        # Same id the request router puts on its ring: lets the ingress attribute cache hits.
        self._serve(
            make_engine(engine),
            serve.get_replica_context().replica_id.unique_id,
            # Resolved here: the environment overrides are this node's.
            streaming=(streaming or StreamingArgs()).resolved(),
            tiers=tiers,
        )
        await self._engine.start()

    def _serve(
        self,
        engine: Engine,
        replica_id: str,
        live_callers: Callable[[], Awaitable[set[str]]] | None = None,
        caller_check_period_s: float = CALLER_CHECK_PERIOD_S,
        streaming: StreamingArgs | None = None,
        tiers: ServiceTierArgs | None = None,
    ) -> None:
        """The replica's state around ``engine`` (the tests build one without Serve so;
        ``streaming`` None: the module's `STREAM_WINDOW_S` and `CHANNEL_IDLE_S`; ``tiers``
        None: no tier capped in the engine)."""
        self._streaming = streaming
        self._engine = engine
        # At most max_running of a tier's requests in the engine at once (issue 49).
        self._gate = TierGate((tiers or ServiceTierArgs()).max_running)
        self._replica_id = replica_id
        # What the routers are told (record_routing_stats): conversations served, the prefix
        # cache per conversation from the engine's own KV-cache events, queued prefill.
        load_rate = getattr(engine, "kv_load_tokens_per_s", None)
        self._reporter = ReplicaReporter(
            replica_id, kv_load_tokens_per_s=load_rate() if load_rate is not None else None
        )
        # (Test engines that are not `Engine`s may lack the hook: they publish nothing.)
        subscribe = getattr(engine, "subscribe_kv_events", None)
        if subscribe is None or not subscribe(self._reporter.held):
            logger.info("the engine publishes no KV-cache events; routers get none from here")
        self._producers: dict[str, asyncio.Task] = {}
        # The requests in flight here by service tier (issue 49): for the autoscaling policy,
        # which may leave a tier out, and the metrics.
        self._by_tier: Counter[str] = Counter()
        self._outboxes: dict[str, Outbox] = {}  # caller -> its open channel (engine_channel)
        self._callers = CallerWatch(
            self._abort_orphan, live_callers or self._live_callers, caller_check_period_s
        )

    def _window_s(self) -> float:
        return STREAM_WINDOW_S if self._streaming is None else self._streaming.window_s

    def _channel_idle_s(self) -> float:
        return CHANNEL_IDLE_S if self._streaming is None else self._streaming.channel_idle_s

    def _heartbeat_s(self) -> float:
        return HEARTBEAT_S if self._streaming is None else self._streaming.heartbeat_s

    async def generate(
        self, request: GenerateRequest, caller: str | None = None
    ) -> AsyncIterator[GenerateChunk | OnChannel | Accepted | Heartbeat]:
        """Stream the engine's chunks until ``caller`` has a channel open here; from then on
        send them on it, after an `OnChannel` marker (``serve_app.serving.engine.channel``).
        A request that starts with the channel open streams only the marker; one that does not
        starts with `Accepted` (the ingress answers its client then: not refused by Ray).

        On its own stream, the engine runs ahead into a queue and every yield sends all that is
        queued as one chunk, so a slow reader gets fewer, larger chunks; after each send the
        next waits out the stream window (`_window_s`). On a channel, the channel's
        `Outbox` does that for all the caller's requests at once.

        ``caller``: the name of the calling replica's actor, watched while the request runs.
        """
        logs.REQUEST_ID.set(request.request_id)  # its lines' id where Serve's context has none
        self._reporter.arrived(
            request.request_id,
            request.session_id,
            len(request.prompt_token_ids),
            request.cache_ttl_s,  # reported: every router keeps the home that long
            deadline_s=request.deadline_s,  # the queue ahead of each tier (issue 49)
            priority=request.priority,
        )
        self._ledger_changed()
        route = _Route(request.request_id, self._replica_id)
        producer = asyncio.create_task(self._produce_routed(request, route))
        self._watch(caller, request.request_id, producer)
        finished = accepted = False
        tier = _tier_label(request)
        metrics.ENGINE_REQUESTS.inc()
        metrics.ENGINE_RUNNING.inc()
        self._by_tier[tier] += 1
        metrics.ENGINE_RUNNING_BY_TIER.labels(tier).inc()
        try:
            while not finished:
                outbox = self._outboxes.get(caller) if caller else None
                if outbox is not None and not outbox.closed:  # closed: its caller is gone
                    route.move_to(outbox, producer)
                    yield OnChannel(self._replica_id)
                    finished = await self._ride(outbox, route, producer, caller)
                    return
                if not accepted:  # at once, not with the first token (after the prefill)
                    accepted = True
                    yield Accepted(self._replica_id)
                    continue
                chunk = await route.next_chunk(self._heartbeat_s())
                if chunk is None:
                    break
                # Nothing for a while: the caller learns we are alive. By type, not identity:
                # Serve ships this class by value, and the singletons its methods name arrive
                # as copies (tests/unit/serving/engine/test_liveness.py).
                if isinstance(chunk, Heartbeat):
                    yield chunk
                    continue
                # A failed route's error chunk is its last, but the engine still runs: the
                # finally stops it.
                finished = chunk.finish_reason is not None and not route.failed
                yield chunk
                if route.failed:
                    break
                if not finished and (window_s := self._window_s()) > 0:
                    # Cancelled here like anywhere (a client gone): the finally aborts.
                    await asyncio.sleep(window_s)
        finally:
            metrics.ENGINE_RUNNING.dec()
            self._by_tier[tier] -= 1
            metrics.ENGINE_RUNNING_BY_TIER.labels(tier).dec()
            await self._settle(caller, request.request_id, producer, finished)

    async def channel(
        self, caller: str, replica: str, loads: bool = False
    ) -> AsyncIterator[ChannelSend]:
        """The channel from this replica to ``caller`` (an ingress replica's actor): the chunks
        of its requests, one batch per send, and, with ``loads`` (a router of the caller places
        by them), this replica's load as it changes, until idle (`StreamingArgs.channel_idle_s`).

        ``replica``: the engine replica the caller asked for (the request router pins the call
        to it). Elsewhere (it is gone), or with a channel to the caller already open, the stream
        ends at once: the caller's requests stream their chunks themselves meanwhile.
        """
        if replica != self._replica_id or caller in self._outboxes:
            return
        load = self._reporter.load if loads else None
        outbox = Outbox(self._window_s(), self._channel_idle_s(), self._heartbeat_s(), load)
        self._outboxes[caller] = outbox
        watch_key = _CHANNEL + caller
        self._callers.add(caller, watch_key)
        try:
            async for send in outbox.sends():
                yield send
        finally:
            # Before anything can await: no request is told to use a channel that has ended.
            if self._outboxes.get(caller) is outbox:
                del self._outboxes[caller]
            outbox.close()
            self._callers.discard(caller, watch_key)
            for producer in outbox.requests.values():  # their chunks can no longer be sent
                producer.cancel()

    @staticmethod
    async def _ride(
        outbox: Outbox, route: _Route, producer: asyncio.Task, caller: str | None
    ) -> bool:
        """Wait for a request whose chunks ride ``outbox``'s channel; whether it finished.
        Raises `ChannelClosed` if the channel ended first (the caller learns it here too)."""
        try:
            await asyncio.wait([producer])  # cancelled here (the client left): the caller aborts
            if outbox.closed:
                raise ChannelClosed(
                    f"the channel to {caller} closed before request {route.request_id}"
                )
            # A producer cancelled because its caller died ends the stream without more ado.
            return not producer.cancelled()
        finally:
            outbox.requests.pop(route.request_id, None)

    def _watch(self, caller: str | None, request_id: str, producer: asyncio.Task) -> None:
        if caller:
            self._producers[request_id] = producer
            self._callers.add(caller, request_id)

    async def _settle(
        self, caller: str | None, request_id: str, producer: asyncio.Task, finished: bool
    ) -> None:
        if caller:
            self._callers.discard(caller, request_id)
            self._producers.pop(request_id, None)
        # The producer says so too, unless it was cancelled before it ever ran.
        self._ended(request_id)
        if not finished:
            # Cancelled by the caller (client disconnect), or the caller died (the watch
            # stopped the producer): stop generating and free KV.
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
            await self._engine.abort(request_id)
        ended = "generated to its end" if finished else "stopped: cancelled, failed or orphaned"
        logger.info("request %s: %s", request_id, ended, extra={"response_id": request_id})

    def _ended(self, request_id: str) -> None:
        if self._reporter.ended(request_id):  # the second of its two ends changes nothing
            self._ledger_changed()

    def _ledger_changed(self) -> None:
        """The prefill ledger changed: every open channel pushes the load (paced: a window)."""
        for outbox in self._outboxes.values():
            outbox.load_changed()

    async def _abort_orphan(self, request_id: str) -> None:
        """Stop a request whose caller died: its stream then ends here, and the engine frees
        its KV now (not when the stream's end is noticed). A dead caller's channel closes."""
        if request_id.startswith(_CHANNEL):
            outbox = self._outboxes.get(request_id.removeprefix(_CHANNEL))
            if outbox is not None:
                outbox.close()
            return
        producer = self._producers.pop(request_id, None)
        if producer is not None:
            producer.cancel()
        await self._engine.abort(request_id)

    @staticmethod
    async def _live_callers() -> set[str]:
        return await asyncio.to_thread(live_actor_names)

    async def _produce_routed(self, request: GenerateRequest, route: _Route) -> None:
        arrived = self._reporter.now()

        def send(chunk: GenerateChunk, first_token: bool) -> None:
            if first_token and chunk.engine_queue_s is not None:
                metrics.ENGINE_QUEUE_WAIT.labels(_tier_label(request)).observe(chunk.engine_queue_s)
            if first_token and chunk.engine_ttft_s is not None:  # to the prefill ledger
                uncached = chunk.num_prompt_tokens - chunk.num_cached_tokens
                at = arrived + chunk.engine_ttft_s
                self._reporter.first_token(request.request_id, uncached, at)
                self._ledger_changed()
            route.send(chunk, first_token)

        try:
            async with self._gate.admitted(request) as admitted:
                await self._produce(admitted, send)
        finally:
            self._ended(request.request_id)
            route.queue.put_nowait(_END)  # for the own stream, if it is still reading

    async def _produce(
        self, request: GenerateRequest, send: Callable[[GenerateChunk, bool], None]
    ) -> None:
        """Run the engine on ``request``, handing each chunk to ``send`` with whether it holds
        the first token; an engine error becomes the last chunk (`error_chunk`)."""
        arrived = time.monotonic()
        first_token = True
        try:
            # aclosing: an engine left mid-stream (an item it must not yield) stops now.
            async with contextlib.aclosing(self._engine.generate(request)) as chunks:
                async for chunk in chunks:
                    if not isinstance(chunk, GenerateChunk):
                        # A bug in the engine, and this request's alone: it ends with a logged
                        # server_error. Passed on, the item would break the channel's batch
                        # (every request riding it) or the stream's merging.
                        await self._engine.abort(request.request_id)
                        raise TypeError(f"the engine yielded a {type(chunk).__name__}")
                    holds_first_token = first_token and bool(chunk.token_ids)
                    if holds_first_token:
                        if chunk.engine_ttft_s is None:  # the engine did not model it
                            chunk.engine_ttft_s = time.monotonic() - arrived
                        first_token = False
                    send(chunk, holds_first_token)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            send(error_chunk(request.request_id, exc), False)

    def replica_id(self) -> str:
        return self._replica_id

    def num_ongoing_requests(self) -> int:
        return self._engine.num_ongoing_requests()

    async def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve hands this to every request router (``serve_app.routing.replica_report``:
        conversations served, the prefix cache per conversation from the engine's KV-cache
        events, queued prefill). Async, so it runs on the event loop that records them."""
        return self._reporter.report()

    async def record_autoscaling_stats(self) -> dict[str, int]:
        """Ray Serve's custom autoscaling metrics: the requests the engine holds, which the
        engine deployment's policy scales on (``serve_app.serving.engine.autoscaling``), and
        those of each service tier, which it may leave out. Serve's own ongoing count also
        holds the open channels, which generate nothing."""
        # Those held at the tier gate are load too, the engine's queue in all but name.
        generating = self._engine.num_ongoing_requests() + self._gate.waiting()
        stats = {GENERATING_REQUESTS: generating}
        stats.update({tier_metric(tier): self._by_tier[tier] for tier in TIERS})
        return stats

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def __del__(self) -> None:
        await self._engine.shutdown()
