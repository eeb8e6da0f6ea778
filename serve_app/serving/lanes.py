"""WebSocket lanes (``stream_id``): one connection, several FIFO queues of requests.

A ``response.create`` names its lane with ``stream_id``; one without it is on the connection's
default lane, so a client that never names one is served as before lanes: one response after
another. The requests of one lane run in the order they arrived; lanes run concurrently, each
response its own engine request. Every event a lane sends carries its ``stream_id`` (none on the
default lane). Lineage is not routing: a lane may continue (fork) any response the connection
knows, whichever lane made it, through ``previous_response_id``.

Bounds (`Limits`): requests queued on the connection, all lanes together, in number
(``max_websocket_queued_requests``) and bytes (``max_websocket_pending_bytes``, which accepted
steering input counts against too); lanes with work (``max_websocket_lanes``). A request over
them on a lane is refused with a 429 ``error`` event on that lane, the connection kept; on the
default lane the connection is closed (1008), as a flood was before lanes.

Every event goes out through the connection's `Outbox`, one writer task: lanes never write the
socket at once, and an event pushed before another is sent before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import WebSocketDisconnect

from serve_app.config import Limits
from serve_app.protocol.errors import APIError
from serve_app.serving.admission import websocket as rules

logger = logging.getLogger(__name__)

# Event messages the outbox holds before a lane waits for the socket to take them.
OUTBOX_HIGH_WATER = 512


class Socket(Protocol):
    async def send_text(self, data: str) -> None: ...


def with_stream_id(text: str, stream_id: str | None) -> str:
    """An event's JSON (an object) with ``stream_id`` added; as it is on the default lane."""
    if stream_id is None:
        return text
    return f'{text[:-1]},"stream_id":{json.dumps(stream_id, ensure_ascii=False)}}}'


class Outbox:
    """The connection's one writer: text messages go out in the order they were pushed.

    `push` never waits (a steering event is pushed from the reader, between two of a lane's
    events, in the order it was decided); `room` is the producers' back-pressure."""

    def __init__(self, socket: Socket, high_water: int = OUTBOX_HIGH_WATER) -> None:
        self._socket = socket
        self._high_water = high_water
        self._queue: deque[str] = deque()
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self.closed = False

    def push(self, texts: Iterable[str]) -> None:
        """Queue ``texts``; `WebSocketDisconnect` once the socket failed (the client left)."""
        if self.closed:
            raise WebSocketDisconnect(1006)
        self._queue.extend(texts)
        self._ready.set()
        if len(self._queue) > self._high_water:
            self._drained.clear()

    async def room(self) -> None:
        """Wait until the socket took the queue down to its high-water mark."""
        if not self._drained.is_set():
            await self._drained.wait()
        if self.closed:
            raise WebSocketDisconnect(1006)

    async def run(self) -> None:
        """Send until cancelled or the socket fails (then `closed`, and producers stop)."""
        try:
            while True:
                while not self._queue:
                    self._ready.clear()
                    await self._ready.wait()
                await self._socket.send_text(self._queue.popleft())
                if len(self._queue) <= self._high_water:
                    self._drained.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away mid-send
            logger.info("websocket: send failed (%s), stopping", type(exc).__name__)
        finally:
            self.closed = True
            self._drained.set()


@dataclass
class LaneSink:
    """What one lane's requests send through: each message tagged with the lane's id."""

    outbox: Outbox
    stream_id: str | None

    async def send_text(self, text: str) -> None:
        await self.send_batch([text])

    async def send_batch(self, texts: list[str]) -> None:
        """One engine chunk's events, pushed whole (no other event can land among them)."""
        self.outbox.push([with_stream_id(text, self.stream_id) for text in texts])
        await self.outbox.room()


@dataclass
class PendingInput:
    """What a connection holds of its client's input beyond what runs: queued requests (in
    number and bytes) and accepted steering input (bytes)."""

    max_requests: int
    max_bytes: int
    requests: int = 0
    bytes: int = 0

    def fits(self, size: int, *, request: bool) -> str | None:
        """None if ``size`` more bytes (and a request) fit; else what bound they would pass."""
        if request and self.requests >= self.max_requests:
            return f"more than {self.max_requests} requests queued"
        if self.bytes + size > self.max_bytes:
            return f"more than {self.max_bytes} bytes of messages pending"
        return None

    def take(self, size: int, *, request: bool) -> None:
        self.bytes += size
        self.requests += request

    def give_back(self, size: int, *, request: bool) -> None:
        self.bytes -= size
        self.requests -= request


@dataclass
class Lane:
    stream_id: str | None
    sink: LaneSink
    # Its requests: the running one first, then the queued ones (with their sizes).
    queue: deque[tuple[Any, int]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


# What the connection does with one queued message of a lane.
Serve = Callable[[Lane, Any], Awaitable[None]]


class Lanes:
    """A connection's lanes: each a FIFO queue and, while it has work, a task serving it."""

    def __init__(self, outbox: Outbox, limits: Limits, pending: PendingInput, serve: Serve) -> None:
        self._outbox = outbox
        self._max_lanes = limits.max_websocket_lanes
        self._pending = pending
        self._serve = serve
        self._lanes: dict[str | None, Lane] = {}
        # When the connection last had a message or a lane became idle (the idle timeout's
        # starting point).
        self.last_activity = time.monotonic()

    @property
    def busy(self) -> bool:
        return bool(self._lanes)

    def sink(self, stream_id: str | None) -> LaneSink:
        lane = self._lanes.get(stream_id)
        return lane.sink if lane else LaneSink(self._outbox, stream_id)

    def offer(self, stream_id: str | None, message: Any, size: int) -> str | APIError | None:
        """Queue ``message`` on its lane. None: queued. A str: why the connection must close
        (a flood on the default lane). An `APIError`: the refusal to send on the lane."""
        self.last_activity = time.monotonic()
        lane = self._lanes.get(stream_id)
        if lane is None and len(self._lanes) < self._max_lanes:
            # An idle lane starts the request at once: it runs, it is not queued.
            lane = Lane(stream_id, LaneSink(self._outbox, stream_id))
            lane.queue.append((message, 0))
            self._lanes[stream_id] = lane
            # A named lane's calls in a context of their own: made in the connection's, every
            # engine call of every lane would carry the WebSocket request's Serve request id
            # (Serve's handles take it from the context), and concurrent calls with one id
            # stall on the engine replica (seen on the serve tier: one lane of four streamed).
            # The default lane keeps the connection's, as before lanes. A lane's calls are
            # cancelled by `close` when the client leaves, not by Serve.
            context = None if stream_id is None else contextvars.Context()
            lane.task = asyncio.create_task(
                self._run(lane), name=f"websocket lane {stream_id}", context=context
            )
            return None
        if (overflow := self._pending.fits(size, request=True)) is not None:
            if stream_id is None:
                return overflow
            return rules.queue_full(overflow)
        if lane is None:
            return rules.too_many_lanes(self._max_lanes)
        self._pending.take(size, request=True)
        lane.queue.append((message, size))
        return None

    async def _run(self, lane: Lane) -> None:
        try:
            first = True
            while lane.queue:
                message, size = lane.queue.popleft()
                if not first:  # the ones after the first waited: they were counted queued
                    self._pending.give_back(size, request=True)
                first = False
                try:
                    await self._serve(lane, message)
                except (asyncio.CancelledError, WebSocketDisconnect):
                    raise
                except Exception:
                    # A bug of ours fails this request, never the lane or the connection.
                    logger.exception("websocket: lane %r: request not served", lane.stream_id)
        except WebSocketDisconnect:
            pass
        finally:
            # No await between the empty queue and leaving: an offer after this makes a new
            # lane.
            if self._lanes.get(lane.stream_id) is lane:
                del self._lanes[lane.stream_id]
            self.last_activity = time.monotonic()

    async def close(self) -> None:
        """Cancel every lane (their engine requests are aborted) and wait for them."""
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
