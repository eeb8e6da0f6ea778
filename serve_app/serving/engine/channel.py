"""One channel per (engine replica, ingress replica): all its requests' new tokens, one item a send.

A streamed handle call costs Ray about the same per item whatever the item carries (issue 21,
docs/benchmarks.md): a stream per request, one item per request per 20 ms window, made Ray's
per-item work most of the engine replica's and the ingress's CPU. So, as vLLM's engine core
hands its API server one batch of outputs per step, an ingress replica opens one long streamed
call to each engine replica it uses, ``EngineDeployment.channel``, and each send on it carries
the chunks of all that ingress's requests on that replica.

Each request is still its own handle call (``EngineDeployment.generate``): the request router
places it (prompt_cache_key affinity), Serve counts it as ongoing for as long as it generates
(routing loads, autoscaling and ``max_ongoing_requests`` stay true), cancelling it aborts it,
and Ray's back-pressure still turns it away. Only its chunks take the channel: where the
replica holds an open channel from the caller, the call's stream carries one `OnChannel`
marker and then ends when the generation does; the chunks go to the caller's `Outbox`.
Otherwise (no channel yet, or none wanted) the call streams its chunks itself, as before, and
the ingress opens a channel to that replica for the requests that follow.

Each send also carries the replica's load (``ReplicaReporter.load``: its queued prefill, rate
and decode count, a few keys), so every ingress replica's request router sees the turns the
OTHER ingress replicas sent there within a window, not a routing-stats period (1 s) later
(``TTFTPredictor.pushed``; docs/routing.md, "Pushed load"). The replica tells every open
channel when its prefill ledger changes (`Outbox.load_changed`: a request arrived, had its first
token, ended); the channel sends the load at once if it sent nothing within its window, else at
the window's end, as of then: loads within a window coalesce into one send. Batches and
heartbeats carry it too, at no extra item. A replica with no channel open to an ingress (none
yet, or closed after ``channel_idle_s`` without requests) reaches its router by its reports only.

This module holds both ends and no Ray: `Outbox` (the engine replica's end: pending chunks,
merged per request, its load, and the pacing of sends) and `Inboxes` (the ingress's end: each
request's queue, fed from the channels).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from serve_app.config import StreamingArgs
from serve_app.engines.base import GenerateChunk
from serve_app.serving.engine.liveness import HEARTBEAT_S

logger = logging.getLogger(__name__)

# A channel with no request for this long closes; the caller opens it again when it next needs
# it. Keeps an idle ingress from holding a request slot on each engine replica (and from
# keeping a replica that Serve stops from draining). The setting is the app's
# (`StreamingArgs.channel_idle_s`); this is its value for a replica built without app args.
CHANNEL_IDLE_S = StreamingArgs().resolved().channel_idle_s

# The chunks of one send: (request id, the request's chunks since its last send, merged).
Batch = list[tuple[str, GenerateChunk]]
# An engine replica's load as it pushes it (`ReplicaReporter.load`).
Load = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ChannelSend:
    """One item on a channel: the chunks since the last send, and the replica's load as of the
    send (None: the replica pushes none). No chunks and no load: a heartbeat (``liveness``);
    every send, a load-only one too, proves the replica alive."""

    batch: Batch
    load: Load | None = None


@dataclass(frozen=True)
class OnChannel:
    """The one item of a ``generate`` stream whose chunks ride the caller's channel from
    ``replica``: the stream then ends when the generation does."""

    replica: str


class ChannelClosed(ConnectionError):
    """A request's channel ended before its last chunk: the engine replica or the channel died."""


class Outbox:
    """The engine replica's end of one caller's channel.

    Chunks wait here, merged per request, for the next send. Sends are at least ``window_s``
    apart, so tokens ride together, except that a request's first token goes out at once (time
    to first token is never held back). ``load`` (the replica's `ReplicaReporter.load`, None:
    no load is pushed) is read at each send and goes with it; `load_changed` asks for a send
    paced like a chunk's. ``requests`` maps each request on the channel to its producer; `sends`
    ends after ``idle_s`` without one (a load-only send does not count), or at `close`.
    """

    def __init__(
        self,
        window_s: float,
        idle_s: float = CHANNEL_IDLE_S,
        heartbeat_s: float = HEARTBEAT_S,
        load: Callable[[], Load] | None = None,
    ) -> None:
        self._window_s = window_s
        self._idle_s = idle_s
        self._heartbeat_s = min(heartbeat_s, idle_s)
        self._load = load
        self._pending: dict[str, GenerateChunk] = {}
        self._load_due = False  # the load changed since the last send
        self._ready = asyncio.Event()  # something is pending (or the channel is closing)
        self._urgent = asyncio.Event()  # a first token is pending: send without the window
        self.requests: dict[str, asyncio.Task] = {}
        self.closed = False

    def put(self, request_id: str, chunk: GenerateChunk, urgent: bool = False) -> None:
        pending = self._pending.get(request_id)
        if pending is None:
            self._pending[request_id] = chunk
        else:
            pending.absorb(chunk)
        self._ready.set()
        if urgent:
            self._urgent.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()
        self._urgent.set()

    def load_changed(self) -> None:
        """The replica's load changed: send it, at once after a quiet window, else at the
        window's end (with whatever else changed by then)."""
        if self._load is not None and not self.closed:
            self._load_due = True
            self._ready.set()

    def _send(self, batch: Batch) -> ChannelSend:
        self._load_due = False
        return ChannelSend(batch, None if self._load is None else self._load())

    async def sends(self) -> AsyncIterator[ChannelSend]:
        """The sends: chunks and the load as it changes, and the load alone (or nothing: a
        heartbeat, ``liveness``) after ``heartbeat_s`` with nothing to send."""
        last_send = float("-inf")
        busy_at = time.monotonic()  # when the channel last had a request or a chunk
        while not self.closed:
            if not self._pending and not self._load_due:
                self._ready.clear()
                try:
                    # asyncio.timeout, not wait_for (Python 3.11's may swallow a cancellation
                    # that comes as its timeout fires: the channel would not close).
                    async with asyncio.timeout(self._heartbeat_s):
                        await self._ready.wait()
                except TimeoutError:
                    now = time.monotonic()
                    if self.requests:
                        busy_at = now
                    # A request may have ended while the wait gave up: its last chunk is then
                    # pending, and still goes out.
                    if self._pending or self._load_due or self.closed:
                        continue
                    if now - busy_at >= self._idle_s:
                        return  # idle: the caller reopens it when it next needs it
                    yield self._send([])  # nothing new for a while: the caller learns we live
                continue
            if self._pending or self.requests:
                busy_at = time.monotonic()
            elif time.monotonic() - busy_at >= self._idle_s:
                return  # only the load (other callers' requests) changed: idle all the same
            wait_s = self._window_s - (time.monotonic() - last_send)
            if wait_s > 0 and not self._urgent.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._urgent.wait()
                if self.closed:
                    return
            batch = list(self._pending.items())
            self._pending.clear()
            self._urgent.clear()
            last_send = time.monotonic()
            yield self._send(batch)


class Inboxes:
    """The ingress's end of its channels: a queue per request, fed by each channel's reader.

    A request's queue exists from before its call (chunks may overtake the call's marker) until
    it is done. `attach` ties it to the channel its marker names, so that channel's end fails it
    (`ChannelClosed` in its queue) if its last chunk had not come.
    """

    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[GenerateChunk | Exception]] = {}
        self._riding: dict[str, set[str]] = {}  # replica -> request ids attached to its channel

    def expect(self, request_id: str) -> asyncio.Queue[GenerateChunk | Exception]:
        queue: asyncio.Queue[GenerateChunk | Exception] = asyncio.Queue()
        self._queues[request_id] = queue
        return queue

    def attach(self, request_id: str, replica: str, channel_open: bool) -> None:
        if not channel_open:
            # The replica sent its chunks to a channel this ingress no longer reads.
            self.fail(request_id, ChannelClosed(f"no channel from engine replica {replica}"))
            return
        self._riding.setdefault(replica, set()).add(request_id)

    def forget(self, request_id: str, replica: str | None = None) -> None:
        self._queues.pop(request_id, None)
        riding = self._riding.get(replica) if replica else None
        if riding is not None:
            riding.discard(request_id)

    def deliver(self, batch: Batch) -> None:
        queues = self._queues
        for request_id, chunk in batch:
            queue = queues.get(request_id)
            if queue is not None:  # else: the request is gone (its client left)
                queue.put_nowait(chunk)

    def fail(self, request_id: str, error: Exception) -> None:
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put_nowait(error)

    def channel_ended(self, replica: str, error: Exception) -> None:
        for request_id in self._riding.pop(replica, set()):
            self.fail(request_id, error)
