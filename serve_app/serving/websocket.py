"""WebSocket mode: ``GET /v1/responses`` upgraded, ``response.create`` messages in, the same
events as the SSE stream out, one JSON text message each, one response after another.

A connection remembers the context of the responses it produced (bounded, newest kept), so a
``previous_response_id`` naming one of them works even with ``store: false``; that memory dies
with the connection, after which such an id is ``previous_response_not_found``. A turn that
fails forgets what it continued from: the client resends the whole history rather than build on
a state the server may not hold as the client thinks.

A ``response.create`` with ``generate: false`` (Codex opens each session with one, a prewarm)
is answered as OpenAI answers it: ``response.created`` and ``response.completed`` with no output
and zero usage, its prompt prefilled in the engine first (one code path with HTTP's
``prompt_cache_options.prewarm``: `ResponsesService.prewarm`). Its id is remembered like any
response's, with the input it carried, so the next turn can continue it by
``previous_response_id`` with only its new items.

What one tenant can hold is bounded (`Limits` in config.py): open connections per ingress
replica and per API key (each holds one of the replica's Ray Serve request slots for its whole
life), a connection's idle time between responses, one message's size (``max_body_bytes``, as an
HTTP body) and the bytes of messages queued behind a streaming response.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, OrderedDict
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from openai.types.responses.responses_server_event import ResponseWsError, ResponseWsErrorError

from serve_app.config import Limits
from serve_app.protocol.errors import APIError, RateLimited
from serve_app.protocol.prompt_cache_diagnostics import PromptFingerprint
from serve_app.protocol.requests import InputItem
from serve_app.protocol.sse import event_json
from serve_app.serving import metrics
from serve_app.serving.admission import websocket as rules
from serve_app.serving.http.auth import ApiKeys
from serve_app.serving.inject import INJECT, InjectDesk, beta_enabled
from serve_app.serving.lanes import (
    Lane,
    Lanes,
    LaneSink,
    Outbox,
    PendingInput,
)
from serve_app.serving.steering import STEER, SteerDesk, Successor, unsteerable_reason
from serve_app.serving.turn.service import ResponsesService
from serve_app.serving.turn.state import Ask, Turn

logger = logging.getLogger(__name__)

# Close codes (RFC 6455): a refused key or a flooding client; an idle connection closed; a
# connection over the limits, to be retried later.
POLICY_VIOLATION = 1008
NORMAL_CLOSURE = 1000
TRY_AGAIN_LATER = 1013
# Messages a client may send ahead of the response being streamed (the default of
# `Limits.max_websocket_queued_requests`); more closes a connection without lanes. Their bytes
# are bounded too (`Limits.max_websocket_pending_bytes`): the count bounds the per-message
# overhead of many tiny ones.
MAX_PENDING_MESSAGES = Limits().max_websocket_queued_requests


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
    """A connection's memory: response id -> the items a continuation of it starts from; and
    (``prompts``) the fingerprint of each one's prompt, which prompt-cache diagnostics compare
    with, kept as long as the response is remembered."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.prompts: dict[str, PromptFingerprint] = {}

    def remember(
        self, response_id: str, context: list[InputItem], prompt: PromptFingerprint | None = None
    ) -> None:
        self[response_id] = context
        if prompt is not None:
            self.prompts[response_id] = prompt
        while len(self) > self.capacity:
            forgotten, _ = self.popitem(last=False)
            self.prompts.pop(forgotten, None)

    def pop(self, response_id: str, default: Any = None) -> Any:
        self.prompts.pop(response_id, None)
        return super().pop(response_id, default)


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
            # The beta's response.inject (serve_app/serving/inject.py) is the connection's.
            beta = beta_enabled(socket.headers.get("openai-beta"))
            await _serve_connection(socket, service, owner, recent, limits, beta=beta)
        finally:
            metrics.WEBSOCKET_CONNECTIONS.dec()
            slots.give_back(owner)

    return router


@dataclass
class _TooLarge:
    """Stands in a lane's queue for a message over ``max_body_bytes``, which is not kept."""

    size: int


@dataclass
class _Message:
    """A client message as read: its text, and its JSON (None if it is not JSON)."""

    text: str
    body: Any


def _size(text: str) -> int:
    # UTF-8 bytes; an ASCII str (the usual JSON) is counted without encoding a copy.
    return len(text) if text.isascii() else len(text.encode())


def _read(text: str) -> _Message:
    """Read for routing (its lane, or a steer); the door parses a create again, in turn."""
    try:
        return _Message(text, json.loads(text))
    except ValueError:
        return _Message(text, None)


async def _serve_connection(
    socket: WebSocket,
    service: ResponsesService,
    owner: str | None,
    recent: RecentResponses,
    limits: Limits,
    *,
    beta: bool = False,
) -> None:
    """Messages are read while responses stream, so a client that goes away mid-response is
    noticed at once: its responses are cancelled, which aborts their engine requests.
    ``response.create`` messages queue on their lane (serve_app.serving.lanes);
    ``response.steer`` is decided as it arrives (serve_app.serving.steering), and
    ``response.inject`` is read as it arrives and offered to its response
    (serve_app.serving.inject). With no
    response running or queued, a connection silent for ``websocket_idle_timeout_s`` is
    closed."""
    outbox = Outbox(socket)
    pending = PendingInput(limits.max_websocket_queued_requests, limits.max_websocket_pending_bytes)
    desk = SteerDesk(outbox, limits, pending)
    injects = InjectDesk(desk, outbox, pending, beta=beta, wait_s=limits.websocket_inject_wait_s)

    async def serve(lane: Lane, message: _Message | _TooLarge) -> None:
        await _serve_message(
            lane.sink, message, service, owner, recent, limits.max_body_bytes, desk, injects
        )

    lanes = Lanes(outbox, limits, pending, serve)
    tasks = [
        asyncio.create_task(outbox.run(), name="websocket outbox"),
        asyncio.create_task(_close_when_idle(socket, lanes, limits.websocket_idle_timeout_s)),
    ]
    try:
        while (text := await _receive_text(socket)) is not None:
            size = _size(text)
            # Over the size of a body: answered in turn with a 413, and not kept meanwhile.
            message = _TooLarge(size) if size > limits.max_body_bytes else _read(text)
            body = message.body if isinstance(message, _Message) else None
            if isinstance(body, dict) and body.get("type") == STEER:
                lanes.last_activity = time.monotonic()
                desk.steer(body, size)
                continue
            if isinstance(body, dict) and body.get("type") == INJECT:
                lanes.last_activity = time.monotonic()
                injects.inject(body, size)
                continue
            if isinstance(body, dict):
                # A response.create continuing a response that waits for the client's outputs:
                # the client answers the old way, so the wait ends now (it runs after it).
                injects.release(body.get("previous_response_id"))
            stream_id = rules.usable_stream_id(body)
            refused = lanes.offer(stream_id, message, size if isinstance(message, _Message) else 0)
            if isinstance(refused, str):
                logger.warning("websocket: %s, closing", refused)
                await socket.close(POLICY_VIOLATION, refused)
                return
            if refused is not None:
                with contextlib.suppress(WebSocketDisconnect):
                    await _send_error(lanes.sink(stream_id), refused)
    finally:
        await lanes.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _close_when_idle(socket: WebSocket, lanes: Lanes, timeout: float) -> None:
    """Close the connection once it had no message and no response for ``timeout`` s."""
    while True:
        idle_for = time.monotonic() - lanes.last_activity
        if not lanes.busy and idle_for >= timeout:
            logger.info("websocket: idle for %gs, closing", timeout)
            await socket.close(NORMAL_CLOSURE, "idle timeout")
            return
        await asyncio.sleep(timeout if lanes.busy else timeout - idle_for)


async def _receive_text(socket: WebSocket) -> str | None:
    """The next message as text (binary frames decoded as UTF-8); None once the client left."""
    message = await socket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    if message.get("text") is not None:
        return message["text"]
    return (message.get("bytes") or b"").decode("utf-8", errors="replace")


async def _serve_message(
    sink: LaneSink,
    message: _Message | _TooLarge,
    service: ResponsesService,
    owner: str | None,
    recent: RecentResponses,
    max_bytes: int,
    desk: SteerDesk,
    injects: InjectDesk,
) -> None:
    """One client message of a lane: its responses streamed back (with any successors that
    steering makes), or an error event."""
    try:
        if isinstance(message, _TooLarge):
            raise rules.message_too_large(message.size, max_bytes)
        create = _parse_create(message)
    except APIError as error:
        await _send_error(sink, error)
        return
    request, steers = desk.take_waiting(create.request, sink.stream_id)
    unsteerable = unsteerable_reason(request)
    successor: Successor | None = None
    while True:
        try:
            turn = await service.prepare(Ask(request, owner, recent, recent_prompts=recent.prompts))
        except APIError as error:
            automatic = successor is not None
            # A client's request that fails forgets what it continued, if its own lane made it
            # (a fork failing does not take another lane's response away).
            if not automatic and desk.lane_of(request.previous_response_id) in (
                sink.stream_id,
                False,
            ):
                recent.pop(request.previous_response_id or "", None)
            if steers:
                desk.fail(steers, error.message)
            if not automatic:  # an automatic successor's refusal is its steers' failure
                await _send_error(sink, error)
            return
        desk.commit(steers)
        if not create.generate:
            await _prewarm(sink, turn, service, recent, desk)
            return
        successor = await _stream(sink, turn, service, recent, desk, injects, unsteerable)
        if successor is None:
            return
        request, steers = successor.request, successor.steers


async def _stream(
    sink: LaneSink,
    turn: Turn,
    service: ResponsesService,
    recent: RecentResponses,
    desk: SteerDesk,
    injects: InjectDesk,
    unsteerable: str | None,
) -> Successor | None:
    """One response streamed on its lane; the successor steering asks for, if any."""
    metrics.WEBSOCKET_RESPONSES.inc()
    record = desk.start(turn, sink.stream_id, unsteerable)
    injects.open(record)
    refused: RateLimited | None = None
    try:
        async with aclosing(service.event_batches(turn)) as batches:
            # A send to a closed socket raises: leaving the loop closes the events, which
            # aborts the engine request.
            async for batch in batches:
                await sink.send_batch([event_json(event) for event in batch])
    except RateLimited as error:  # the engines at capacity before its first event
        refused = error
    finally:
        injects.end(record)  # before `desk.end` forgets the turn
        successor = desk.end(record)
    request = turn.request
    if refused is not None:
        # As over HTTP (a 429 before the stream): an error event, no response.created; the
        # response never existed, and what it continued is forgotten as for a failure.
        if desk.lane_of(request.previous_response_id) in (sink.stream_id, False):
            recent.pop(request.previous_response_id or "", None)
        await _send_error(sink, refused)
        return None
    if turn.response.status == "failed":
        # A failure forgets what it continued, if its own lane made it (a fork failing does
        # not take another lane's response away).
        if desk.lane_of(request.previous_response_id) in (sink.stream_id, False):
            recent.pop(request.previous_response_id or "", None)
    else:
        recent.remember(turn.response.id, service.continuation(turn), turn.prompt)
    return successor


async def _prewarm(
    sink: LaneSink,
    turn: Turn,
    service: ResponsesService,
    recent: RecentResponses,
    desk: SteerDesk,
) -> None:
    """A prewarm turn (``generate: false`` or ``prompt_cache_options.prewarm``): validated and
    rendered like any (so its errors are the same), prefilled and answered with an empty
    completed response as over HTTP (`ResponsesService.prewarm`)."""
    events = await service.prewarm(turn, routable=False)
    # Stored (so HTTP and other sockets can continue it too) before it is answered completed.
    if events[-1].type == "response.completed":
        recent.remember(turn.response.id, service.continuation(turn), turn.prompt)
        logger.info("websocket: prewarm %s answered without generating", turn.response.id)
    desk.ended_at_once(turn.response, sink.stream_id, sequences=len(events))
    await sink.send_batch([event_json(event) for event in events])


def _parse_create(read: _Message) -> rules.Create:
    """A ``response.create`` (the door's `rules.parse_create`), its ``stream_id`` checked."""
    rules.check_stream_id(read.body)
    return rules.parse_create(read.text)


async def _send_error(socket: LaneSink, error: APIError) -> None:
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
