"""WebSocket mode: ``GET /v1/responses`` upgraded, ``response.create`` messages in, the same
events as the SSE stream out, one JSON text message each, one response after another.

A connection remembers the context of the responses it produced (bounded, newest kept), so a
``previous_response_id`` naming one of them works even with ``store: false``; that memory dies
with the connection, after which such an id is ``previous_response_not_found``. A turn that
fails forgets what it continued from: the client resends the whole history rather than build on
a state the server may not hold as the client thinks.

A ``response.create`` with ``generate: false`` (Codex opens each session with one, a prewarm)
is answered as OpenAI answers it: ``response.created`` and ``response.completed`` with no output
and zero usage, without calling the engine. Its id is remembered like any response's, with the
input it carried, so the next turn can continue it by ``previous_response_id`` with only its new
items.

What one tenant can hold is bounded (`Limits` in config.py): open connections per ingress
replica and per API key (each holds one of the replica's Ray Serve request slots for its whole
life), a connection's idle time between responses, one message's size (``max_body_bytes``, as an
HTTP body) and the bytes of messages queued behind a streaming response.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from openai.types.responses.responses_server_event import ResponseWsError, ResponseWsErrorError

from serve_app.config import Limits
from serve_app.protocol.errors import APIError
from serve_app.protocol.requests import InputItem
from serve_app.protocol.responses import usage
from serve_app.protocol.sse import event_json
from serve_app.serving import metrics
from serve_app.serving.admission import websocket as rules
from serve_app.serving.http.auth import ApiKeys
from serve_app.serving.turn.service import ResponsesService
from serve_app.serving.turn.state import Ask, Turn

logger = logging.getLogger(__name__)

# Close codes (RFC 6455): a refused key or a flooding client; an idle connection closed; a
# connection over the limits, to be retried later.
POLICY_VIOLATION = 1008
NORMAL_CLOSURE = 1000
TRY_AGAIN_LATER = 1013
# Messages a client may send ahead of the response being streamed; more closes the connection.
# Their bytes are bounded too (`Limits.max_websocket_pending_bytes`): the count bounds the
# per-message overhead of many tiny ones.
MAX_PENDING_MESSAGES = 16


class ConnectionSlots:
    """The open connections of this ingress replica, in all and per key (owner digest).

    One tenant's connections cannot take every slot of the replica: each WebSocket holds one of
    Ray Serve's `max_ongoing_requests` slots until it closes, and a replica at that limit serves
    nothing else, `/health` included (the proxy queues every further request for it).
    """

    def __init__(self, per_replica: int, per_key: int) -> None:
        self.per_replica = per_replica
        self.per_key = per_key
        self.total = 0
        self._by_owner: Counter[str] = Counter()

    def take(self, owner: str | None) -> None:
        """One slot for ``owner``; raises `TooManyConnections` (429) when none is left."""
        rules.check_connection_slot(self.total, self.per_replica, "on this server")
        # Without API keys every client is the same owner: only the total applies.
        if owner is not None:
            rules.check_connection_slot(self._by_owner[owner], self.per_key, "for this API key")
        self.total += 1
        if owner is not None:
            self._by_owner[owner] += 1

    def give_back(self, owner: str | None) -> None:
        self.total -= 1
        if owner is not None:
            self._by_owner[owner] -= 1
            if not self._by_owner[owner]:
                del self._by_owner[owner]


class RecentResponses(OrderedDict[str, list[InputItem]]):
    """A connection's memory: response id -> the items a continuation of it starts from."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def remember(self, response_id: str, context: list[InputItem]) -> None:
        self[response_id] = context
        while len(self) > self.capacity:
            self.popitem(last=False)


def websocket_router(service: ResponsesService, api_keys: ApiKeys, limits: Limits) -> APIRouter:
    router = APIRouter()
    slots = ConnectionSlots(limits.max_websockets_per_replica, limits.max_websockets_per_key)

    @router.websocket("/v1/responses")
    async def responses_socket(socket: WebSocket) -> None:
        await socket.accept()
        try:
            owner = api_keys.owner(socket.headers.get("authorization"))
        except APIError as refused:
            await _send_error(socket, refused)
            await socket.close(POLICY_VIOLATION)
            return
        try:
            slots.take(owner)
        except rules.TooManyConnections as refused:
            await _send_error(socket, refused)
            await socket.close(TRY_AGAIN_LATER)
            return
        metrics.WEBSOCKET_CONNECTIONS.inc()
        try:
            recent = RecentResponses(limits.max_connection_responses)
            await _serve_connection(socket, service, owner, recent, limits)
        finally:
            metrics.WEBSOCKET_CONNECTIONS.dec()
            slots.give_back(owner)

    return router


@dataclass
class _TooLarge:
    """Stands in the inbox for a message over ``max_body_bytes``, which is not kept."""

    size: int


class _Inbox:
    """Messages waiting their turn, bounded in number and in bytes; None: the client left."""

    def __init__(self, max_bytes: int) -> None:
        self._queue: asyncio.Queue[str | _TooLarge | None] = asyncio.Queue()
        self._max_bytes = max_bytes
        self.bytes = 0

    def put(self, message: str | _TooLarge) -> str | None:
        """Queue ``message``; or, when it would pass a bound, why the connection must close."""
        size = _size(message) if isinstance(message, str) else 0
        if self._queue.qsize() >= MAX_PENDING_MESSAGES:
            return f"more than {MAX_PENDING_MESSAGES} messages pending"
        if self.bytes + size > self._max_bytes:
            return f"more than {self._max_bytes} bytes of messages pending"
        self.bytes += size
        self._queue.put_nowait(message)
        return None

    def leave(self) -> None:
        self._queue.put_nowait(None)

    async def get(self) -> str | _TooLarge | None:
        message = await self._queue.get()
        if isinstance(message, str):
            self.bytes -= _size(message)
        return message


def _size(text: str) -> int:
    # UTF-8 bytes; an ASCII str (the usual JSON) is counted without encoding a copy.
    return len(text) if text.isascii() else len(text.encode())


async def _serve_connection(
    socket: WebSocket,
    service: ResponsesService,
    owner: str | None,
    recent: RecentResponses,
    limits: Limits,
) -> None:
    """Messages are read while a response streams, so a client that goes away mid-response
    is noticed at once: the response is cancelled, which aborts its engine request. Messages
    sent meanwhile wait their turn. With no response streaming, a connection silent for
    ``websocket_idle_timeout_s`` is closed."""
    inbox = _Inbox(limits.max_websocket_pending_bytes)
    serving: asyncio.Task[None] | None = None

    async def read() -> None:
        try:
            while (text := await _receive_text(socket)) is not None:
                size = _size(text)
                # Over the size of a body: answered in turn with a 413, and not kept meanwhile.
                message = _TooLarge(size) if size > limits.max_body_bytes else text
                if (overflow := inbox.put(message)) is not None:
                    logger.warning("websocket: %s, closing", overflow)
                    await socket.close(POLICY_VIOLATION, overflow)
                    return
        finally:
            inbox.leave()
            if serving is not None:
                serving.cancel()

    reader = asyncio.create_task(read())
    try:
        while True:
            try:
                message = await asyncio.wait_for(inbox.get(), limits.websocket_idle_timeout_s)
            except TimeoutError:
                logger.info("websocket: idle for %gs, closing", limits.websocket_idle_timeout_s)
                await socket.close(NORMAL_CLOSURE, "idle timeout")
                return
            if message is None:
                return
            serving = asyncio.create_task(
                _serve_message(socket, message, service, owner, recent, limits.max_body_bytes)
            )
            try:
                await serving
            except asyncio.CancelledError:
                if not reader.done():
                    raise  # this handler itself is being cancelled
                return
            except WebSocketDisconnect:
                return
            finally:
                serving = None
    finally:
        reader.cancel()


async def _receive_text(socket: WebSocket) -> str | None:
    """The next message as text (binary frames decoded as UTF-8); None once the client left."""
    message = await socket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    if message.get("text") is not None:
        return message["text"]
    return (message.get("bytes") or b"").decode("utf-8", errors="replace")


async def _serve_message(
    socket: WebSocket,
    message: str | _TooLarge,
    service: ResponsesService,
    owner: str | None,
    recent: RecentResponses,
    max_bytes: int,
) -> None:
    """One client message: a response streamed back, or an error event."""
    try:
        if isinstance(message, _TooLarge):
            raise rules.message_too_large(message.size, max_bytes)
        create = rules.parse_create(message)
    except APIError as error:
        await _send_error(socket, error)
        return
    request = create.request
    try:
        turn = await service.prepare(Ask(request, owner, recent))
    except APIError as error:
        recent.pop(request.previous_response_id or "", None)
        await _send_error(socket, error)
        return
    if not create.generate:
        await _prewarm(socket, turn, service, recent)
        return
    metrics.WEBSOCKET_RESPONSES.inc()
    async with aclosing(service.events(turn)) as events:
        # A send to a closed socket raises: leaving the loop closes the events, which aborts
        # the engine request.
        async for event in events:
            await socket.send_text(event_json(event))
    if turn.response.status == "failed":
        recent.pop(request.previous_response_id or "", None)
    else:
        recent.remember(turn.response.id, service.continuation(turn))


async def _prewarm(
    socket: WebSocket, turn: Turn, service: ResponsesService, recent: RecentResponses
) -> None:
    """A ``generate: false`` turn: validated and rendered like any (so its errors are the same),
    answered at once with an empty completed response; the engine is not called."""
    # No tokens: a completed response with no output and zero usage.
    events = turn.translator.writer.answer_at_once(usage(0, 0, 0, 0))
    # Stored (so HTTP and other sockets can continue it too) before it is answered completed.
    if (failed := await service.keep(turn)) is None:
        recent.remember(turn.response.id, service.continuation(turn))
        logger.info("websocket: prewarm %s answered without generating", turn.response.id)
    else:
        events[-1] = failed
    for event in events:
        await socket.send_text(event_json(event))


async def _send_error(socket: WebSocket, error: APIError) -> None:
    metrics.REQUESTS.labels("rejected").inc()
    logger.info(
        "websocket: rejected: %s (param %s, code %s)", error.message, error.param, error.code
    )
    event = ResponseWsError(
        type="error",
        status=error.status_code,
        error=ResponseWsErrorError(
            type=error.error_type, code=error.code, message=error.message, param=error.param
        ),
    )
    await socket.send_text(event.model_dump_json(exclude_unset=True))
