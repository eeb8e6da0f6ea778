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
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from openai.types.responses import ResponseCompletedEvent, ResponseCreatedEvent
from openai.types.responses.responses_server_event import ResponseWsError, ResponseWsErrorError
from pydantic import BaseModel, ConfigDict, ValidationError

from serve_app.protocol.errors import APIError, InvalidRequest, from_validation_errors
from serve_app.protocol.requests import STRICT_TYPES, InputItem, ResponsesRequest
from serve_app.protocol.sse import event_json
from serve_app.serving import metrics
from serve_app.serving.auth import ApiKeys
from serve_app.serving.responses_service import ResponsesService, Turn

logger = logging.getLogger(__name__)

CREATE = "response.create"
# Close code for a refused connection (RFC 6455: policy violation).
POLICY_VIOLATION = 1008
# Messages a client may send ahead of the response being streamed; more closes the connection
# (memory stays bounded whatever a client sends).
MAX_PENDING_MESSAGES = 16


class RecentResponses(OrderedDict[str, list[InputItem]]):
    """A connection's memory: response id -> the items a continuation of it starts from."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def remember(self, response_id: str, context: list[InputItem]) -> None:
        self[response_id] = context
        while len(self) > self.capacity:
            self.popitem(last=False)


def websocket_router(service: ResponsesService, api_keys: ApiKeys, capacity: int) -> APIRouter:
    router = APIRouter()

    @router.websocket("/v1/responses")
    async def responses_socket(socket: WebSocket) -> None:
        await socket.accept()
        try:
            owner = api_keys.owner(socket.headers.get("authorization"))
        except APIError as refused:
            await _send_error(socket, refused)
            await socket.close(POLICY_VIOLATION)
            return
        metrics.WEBSOCKET_CONNECTIONS.inc()
        try:
            await _serve_connection(socket, service, owner, RecentResponses(capacity))
        finally:
            metrics.WEBSOCKET_CONNECTIONS.dec()

    return router


async def _serve_connection(
    socket: WebSocket, service: ResponsesService, owner: str | None, recent: RecentResponses
) -> None:
    """Messages are read while a response streams, so a client that goes away mid-response
    is noticed at once: the response is cancelled, which aborts its engine request. Messages
    sent meanwhile wait their turn."""
    inbox: asyncio.Queue[str | None] = asyncio.Queue()
    serving: asyncio.Task[None] | None = None

    async def read() -> None:
        try:
            while (text := await _receive_text(socket)) is not None:
                if inbox.qsize() >= MAX_PENDING_MESSAGES:
                    logger.warning("websocket: %d messages pending, closing", inbox.qsize())
                    await socket.close(POLICY_VIOLATION, "too many pending messages")
                    return
                await inbox.put(text)
        finally:
            await inbox.put(None)
            if serving is not None:
                serving.cancel()

    reader = asyncio.create_task(read())
    try:
        while (text := await inbox.get()) is not None:
            serving = asyncio.create_task(_serve_message(socket, text, service, owner, recent))
            try:
                await serving
            except asyncio.CancelledError:
                if not reader.done():
                    raise  # this handler itself is being cancelled
                return
            except WebSocketDisconnect:
                return
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
    text: str,
    service: ResponsesService,
    owner: str | None,
    recent: RecentResponses,
) -> None:
    """One client message: a response streamed back, or an error event."""
    try:
        create = _parse_create(text)
    except APIError as error:
        await _send_error(socket, error)
        return
    request = create.request
    try:
        turn = await service.prepare(request, owner, recent)
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
    created = turn.response
    # No tokens: the translator's completed response has no output and zero usage.
    turn.translator.finish("stop", prompt_tokens=0, cached_tokens=0)
    if turn.request.store:
        await service.save(turn)  # so HTTP and other sockets can continue it too
    recent.remember(turn.response.id, service.continuation(turn))
    logger.info("websocket: prewarm %s answered without generating", turn.response.id)
    for event in (
        ResponseCreatedEvent(type="response.created", response=created, sequence_number=0),
        ResponseCompletedEvent(
            type="response.completed", response=turn.response, sequence_number=1
        ),
    ):
        await socket.send_text(event_json(event))


@dataclass
class _Create:
    """A ``response.create`` message: the request, and whether to generate its answer."""

    request: ResponsesRequest
    generate: bool


def _parse_create(text: str) -> _Create:
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"The message is not valid JSON: {exc}") from exc
    if not isinstance(message, dict) or message.get("type") != CREATE:
        kind = message.get("type") if isinstance(message, dict) else None
        raise InvalidRequest(
            f"Unsupported message type {kind!r}: send {{'type': '{CREATE}', ...}}.", param="type"
        )
    body = {key: value for key, value in message.items() if key != "type"}
    if body.get("background"):
        raise InvalidRequest(
            "Background responses are created over HTTP, not WebSocket.", param="background"
        )
    generate = _generate(body)
    if not generate and body.get("conversation") is not None:
        # A prewarm's input would have to join the conversation with no answer after it.
        raise InvalidRequest(
            "`generate: false` is not supported with `conversation`.", param="generate"
        )
    try:
        request = ResponsesRequest.model_validate({**body, "stream": True})
    except ValidationError as exc:
        raise from_validation_errors(list(exc.errors())) from exc
    return _Create(request, generate)


class _PromptCacheOptions(BaseModel):
    model_config = ConfigDict(**STRICT_TYPES, extra="ignore")
    prewarm: bool | None = None


class _Generation(BaseModel):
    """The WebSocket-only fields of ``response.create`` that say whether to generate."""

    model_config = ConfigDict(**STRICT_TYPES, extra="ignore")
    generate: bool | None = None  # default true
    prompt_cache_options: _PromptCacheOptions | None = None  # `prewarm: true` overrides

    @property
    def wanted(self) -> bool:
        prewarm = self.prompt_cache_options.prewarm if self.prompt_cache_options else None
        return self.generate is not False and prewarm is not True


def _generate(body: dict) -> bool:
    try:
        return _Generation.model_validate(body).wanted
    except ValidationError as exc:
        raise from_validation_errors(list(exc.errors())) from exc


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
