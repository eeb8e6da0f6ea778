"""How the ingress reaches engine replicas: a Serve handle, streamed and keyed for routing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Collection, Coroutine
from contextvars import Context
from typing import Any, Protocol

import ray
from ray.serve.exceptions import BackPressureError

from serve_app.engines.base import Engine, GenerateChunk, GenerateRequest, error_chunk
from serve_app.protocol.errors import RateLimited
from serve_app.routing.local_routers import await_reported, push_load, wants_loads
from serve_app.serving.engine.channel import ChannelClosed, ChannelSend, Inboxes, OnChannel
from serve_app.serving.engine.liveness import (
    Accepted,
    EngineSilent,
    Heartbeat,
    Pulse,
    Watchdog,
)
from serve_app.serving.metrics import ENGINE_CHANNELS, ENGINE_STREAMS_ON_CHANNEL, ENGINE_STREAMS_OWN

logger = logging.getLogger(__name__)

# A channel an engine replica refused (it is gone, or the call found it full) is not asked for
# again sooner than this; its requests stream on their own meanwhile.
CHANNEL_RETRY_S = 1.0
# How Ray Serve names a replica's actor: this prefix, then "app#deployment#<replica id>".
SERVE_REPLICA_PREFIX = "SERVE_REPLICA::"


class EngineClient(Protocol):
    def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream a request's chunks; closing the iterator early aborts the request. The first
        chunk comes once an engine has taken the request (an empty one if that is known before
        its first token); a refusal before it (every engine full) raises `RateLimited`."""
        ...

    async def ping(self) -> None:
        """One cheap call to an engine (readiness): raises when none can answer."""
        ...

    async def await_routable(self, session_id: str) -> bool:
        """Wait (bounded) until a next request of ``session_id``, through any caller, goes
        where the last one went. False if that could not be confirmed in time."""
        ...


class HandleEngineClient:
    """Calls the engine deployment through its handle. Ray's back-pressure error (every engine
    replica and the queue full) comes out as `RateLimited`.

    ``session_id`` carries the routing key, so the engine deployment's request router can keep
    a conversation on the replica that holds its prefix in KV cache. ``caller``: the name of
    this (ingress) replica's actor, so an engine replica aborts the requests of a caller that
    died (see serve_app.serving.engine.deployment), and so it can open a channel to each
    engine replica it uses: their requests' chunks then come over it, one batch per send, not
    one stream item per chunk (``serve_app.serving.engine.channel``). ``channels=False``
    keeps every request on its own stream. Every stream from an engine replica carries
    heartbeats, and one silent too long fails its requests (``engine.liveness``).
    """

    def __init__(
        self,
        handle,
        caller: str | None = None,
        channels: bool = True,
        watchdog: Watchdog | None = None,
    ) -> None:
        self._handle = handle.options(stream=True)  # a DeploymentHandle
        self._unary = handle.options(stream=False)
        self._caller = caller
        self._use_channels = channels and caller is not None
        self._inboxes = Inboxes()
        self._channels: dict[str, asyncio.Task] = {}  # engine replica -> its channel's reader
        self._reopen_at: dict[str, float] = {}  # engine replica -> no new try before then
        self._lingering: set[asyncio.Task] = set()  # ends of finished requests' streams
        self._watchdog = watchdog or Watchdog()

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        request_id = request.request_id
        # Before the call: once its marker is out, its chunks may come over the channel first.
        inbox = self._inboxes.expect(request_id) if self._use_channels else None
        call = self._handle.options(session_id=request.session_id).generate
        response = call.remote(request, caller=self._caller)
        finished = False
        replica = None
        pulse: Pulse | None = None
        try:
            # The own stream: chunks, or a marker after which the rest rides a channel.
            async for item in response:
                if pulse is None:  # watched from its first item: it may wait in a queue before
                    pulse = self._watchdog.watch(response.cancel, _replica_of(item))
                    if isinstance(item, Accepted | OnChannel | Heartbeat):
                        # The replica has it, Ray's back-pressure can no longer refuse it: the
                        # caller may tell its client so (an empty chunk), before any token.
                        yield GenerateChunk(replica=_replica_of(item))
                else:
                    pulse.beat()
                match item:
                    case Accepted():
                        replica = item.replica  # a channel for the next requests
                        self._open_channel(replica)
                        continue
                    case Heartbeat():
                        continue
                    case OnChannel():
                        replica = item.replica
                        break
                    case GenerateChunk():
                        if replica is None:  # the first chunk names the replica: a channel
                            replica = item.replica  # for the next requests
                            self._open_channel(replica)
                        finished = item.finish_reason is not None
                        yield item
                    case _:
                        yield _unexpected(request_id, item, "its stream")
                        return  # unfinished: the finally cancels the call
            else:
                ENGINE_STREAMS_OWN.inc()
                return
            self._watchdog.forget(pulse)  # the channel's heartbeats watch it from here
            # The rest rides the channel (the replica moved the request to it, or it started
            # there): its own stream ends with the generation, or raises if the call fails.
            if inbox is None:
                # Not ours to read: this client opens no channel (channels off here, and
                # another client with the same caller name has one open on that replica).
                logger.error("request %s: moved to a channel this client does not read", request_id)
                raise ChannelClosed(
                    f"engine replica {replica} sent request {request_id}'s chunks "
                    "to a channel this client does not read"
                )
            ENGINE_STREAMS_ON_CHANNEL.inc()
            self._inboxes.attach(request_id, replica, replica in self._channels)
            self._linger(_fail_on_error(response, inbox))
            while not finished:
                match await inbox.get():
                    case GenerateChunk() as chunk:
                        finished = chunk.finish_reason is not None
                        yield chunk
                    case Exception() as error:  # the channel or the call ended first
                        raise error
                    case unexpected:
                        yield _unexpected(request_id, unexpected, "its channel")
                        return
        except BackPressureError as exc:
            # Every engine replica is full, and the queue too: ours, so the service needs no Ray.
            # The call never reached a replica: nothing to cancel (cancelling it would raise
            # Ray's error again, in place of ours).
            finished = True
            raise RateLimited() from exc
        except Exception as exc:
            if pulse is not None and pulse.silent:  # the watchdog cancelled the call: say why
                raise _silent(f"request {request_id}", replica, pulse) from exc
            raise
        finally:
            self._watchdog.forget(pulse)
            self._inboxes.forget(request_id, replica)
            if not finished:
                # The client went away (or the ingress failed): cancel the engine call, which
                # makes the engine replica abort the request and free its KV blocks.
                response.cancel()

    async def ping(self) -> None:
        """An engine replica's health check, through the handle (routed as a request without
        a conversation: to the least loaded). Every replica and the queue full: busy, not
        broken, so no error."""
        with contextlib.suppress(BackPressureError):
            await self._unary.check_health.remote()

    async def await_routable(self, session_id: str) -> bool:
        """The routers in this process see where they placed ``session_id`` in the engine
        replicas' reports, which every ingress replica's router receives alike
        (`serve_app.routing.local_routers.await_reported`)."""
        return await await_reported(session_id)

    def _open_channel(self, replica: str | None) -> None:
        """Open a channel to ``replica`` unless one is open (or was refused a moment ago)."""
        if not self._use_channels or replica is None or replica in self._channels:
            return
        if self._reopen_at.get(replica, 0.0) > time.monotonic():
            return
        # In a context of its own: made in the request's, the channel call would be that
        # request's child, and Serve cancels a request's children when its client leaves,
        # failing every other request riding the channel.
        self._channels[replica] = asyncio.create_task(
            self._read_channel(replica), name=f"engine channel {replica}", context=Context()
        )

    async def _read_channel(self, replica: str) -> None:
        """Deliver the channel's batches, and hand the replica's loads to this process's
        routers (`push_load`), until it ends; then fail its requests still waiting (none,
        unless the replica or the channel died)."""
        # The replica's load rides the channel only if a router here places by it.
        response = self._handle.channel.remote(self._caller, replica=replica, loads=wants_loads())
        ended: Exception = ChannelClosed(f"the channel from engine replica {replica} closed")
        delivered = False
        ENGINE_CHANNELS.inc()
        # Silent too long (the replica died, or hangs): this reader is stopped, whatever the
        # transport does with the call, and the requests riding the channel fail.
        pulse = self._watchdog.watch(asyncio.current_task().cancel, replica)
        try:
            async for send in response:  # no chunks and no load: a heartbeat
                pulse.beat()
                delivered = True
                if not isinstance(send, ChannelSend):
                    raise TypeError(f"the channel carried a {type(send).__name__}")
                self._inboxes.deliver(send.batch)
                if send.load is not None:
                    push_load(replica, send.load)
        except asyncio.CancelledError:
            if not pulse.silent:
                raise
            ended = _silent("the channel", replica, pulse)
            with contextlib.suppress(Exception):
                response.cancel()
        except Exception as exc:
            logger.warning("engine channel from %s failed: %r", replica, exc)
            ended = ChannelClosed(f"the channel from engine replica {replica} failed: {exc!r}")
            with contextlib.suppress(Exception):
                response.cancel()  # the replica must not keep sending to a reader gone
        finally:
            self._watchdog.forget(pulse)
            ENGINE_CHANNELS.dec()
            del self._channels[replica]
            if delivered:
                self._reopen_at.pop(replica, None)
            else:  # refused (the replica is gone, or full): not again at once
                self._reopen_at[replica] = time.monotonic() + CHANNEL_RETRY_S
            self._inboxes.channel_ended(replica, ended)

    def _linger(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._lingering.add(task)
        task.add_done_callback(self._lingering.discard)


def _silent(what: str, replica: str | None, pulse: Pulse) -> EngineSilent:
    """The error of a stream the watchdog found silent (logged: a replica died or hangs)."""
    message = (
        f"{what} from engine replica {replica or '(not known yet)'} carried nothing for "
        f"{pulse.silent_for:.1f} s, heartbeats included: the replica is gone or stuck"
    )
    logger.warning(message)
    return EngineSilent(message)


def _replica_of(item: object) -> str | None:
    """The engine replica a stream's item names, if it names one."""
    match item:
        case Accepted(replica=replica) | OnChannel(replica=replica):
            return replica
        case GenerateChunk(replica=replica):
            return replica
    return None


async def replicas_gone(replicas: Collection[str]) -> set[str]:
    """Those of these engine replicas (Serve replica ids) whose actor Ray no longer lists: a
    dead actor's name is released, a kill shows within well under a second. One GCS call, off
    the event loop (`Watchdog`'s question before it fails a silent replica's streams). Raises
    if the listing lacks even this ingress's own replica: Ray could not be asked."""
    alive = await asyncio.to_thread(_serve_replica_ids)
    if not alive:
        raise LookupError("Ray listed no Serve replica, this one included")
    return set(replicas) - alive


def _serve_replica_ids() -> set[str]:
    return {
        actor["name"].rsplit("#", 1)[-1]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith(SERVE_REPLICA_PREFIX)
    }


def _unexpected(request_id: str, item: object, where: str) -> GenerateChunk:
    """The last chunk of a request whose engine sent ``item``, neither a chunk nor a marker
    (a bug, logged): a ``server_error`` for that request alone, whose engine call is then
    cancelled (the request is left unfinished)."""
    error = TypeError(f"{where} carried a {type(item).__name__}, not a chunk")
    return error_chunk(request_id, error)


async def _fail_on_error(response: Any, inbox: asyncio.Queue) -> None:
    """Wait out a channel request's own stream (its marker read): if the call fails (the
    engine replica died, say), the request's reader gets the error."""
    try:
        async for _ in response:
            pass
    except Exception as exc:
        inbox.put_nowait(exc)


class InProcessEngineClient:
    """Runs an engine in the caller's process: the ingress app without Ray (tests, debugging).
    An engine's exception ends the stream with an error chunk, as the engine deployment's does."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        finished = False
        yield GenerateChunk()  # taken at once: nothing in this process refuses a request
        try:
            async for chunk in self._engine.generate(request):
                yield chunk
                finished = chunk.finish_reason is not None
        except Exception as exc:
            finished = True  # the engine is done with the request
            yield error_chunk(request.request_id, exc)
        finally:
            if not finished:
                await self._engine.abort(request.request_id)

    async def ping(self) -> None:
        await self._engine.check_health()

    async def await_routable(self, session_id: str) -> bool:
        return True  # one engine, nothing to route
