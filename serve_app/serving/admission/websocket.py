"""The rules of a WebSocket connection (``/v1/responses``): how many connections a replica
and a key may hold (429), and each message: at most the body limit (413), a
``response.create`` of a request the HTTP route would take (400), with its WebSocket-only
fields (``generate``, ``prompt_cache_options.prewarm``, ``stream_id``), and room for it on its
lane (429: the connection's lanes and queue are bounded). The errors go back as error events."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError

from serve_app.protocol.body_errors import from_validation_errors
from serve_app.protocol.errors import APIError, InvalidRequest
from serve_app.protocol.prompt_cache import PromptCacheOptions, is_prewarm
from serve_app.protocol.request_base import STRICT_TYPES
from serve_app.protocol.requests import ResponsesRequest

CREATE = "response.create"
# The longest `stream_id` taken (a longer one is a 400 naming it).
MAX_STREAM_ID_LENGTH = 256


class TooManyConnections(APIError):
    status_code = 429
    error_type = "rate_limit_error"


def check_connection_slot(held: int, limit: int, where: str) -> None:
    """One more connection ``where`` (``on this server``, ``for this API key``), holding
    ``held`` of its ``limit``: a 429 (close code 1013 follows) when none is left."""
    if held >= limit:
        raise TooManyConnections(
            f"Too many WebSocket connections {where} ({limit}): close one or try again later.",
            code="rate_limit_exceeded",
        )


class LaneRefused(APIError):
    """A request over the connection's lane or queue bounds: refused on its lane."""

    status_code = 429
    error_type = "rate_limit_error"


def usable_stream_id(body: object) -> str | None:
    """The lane a message's body names: its ``stream_id`` when it is a usable one (else the
    default lane, where `check_stream_id` answers a bad one)."""
    stream_id = body.get("stream_id") if isinstance(body, dict) else None
    if isinstance(stream_id, str) and 0 < len(stream_id) <= MAX_STREAM_ID_LENGTH:
        return stream_id
    return None


def check_stream_id(body: object) -> None:
    """A ``stream_id`` that is there must be usable: a 400 naming it."""
    if isinstance(body, dict) and "stream_id" in body and usable_stream_id(body) is None:
        raise InvalidRequest(
            f"`stream_id` must be a string of 1 to {MAX_STREAM_ID_LENGTH} characters.",
            param="stream_id",
        )


def queue_full(overflow: str) -> LaneRefused:
    """The refusal of a request the connection's queue has no room for (``overflow``: which
    bound it would cross)."""
    return LaneRefused(
        f"Too many requests queued on this connection ({overflow}): wait for a response to end.",
        code="rate_limit_exceeded",
    )


def too_many_lanes(max_lanes: int) -> LaneRefused:
    """The refusal of a request for a new lane when ``max_lanes`` are busy."""
    return LaneRefused(
        f"Too many lanes busy on this connection (at most {max_lanes}): wait for one to "
        "finish, or queue on a busy lane.",
        param="stream_id",
        code="rate_limit_exceeded",
    )


def message_too_large(size: int, max_bytes: int) -> APIError:
    return APIError(f"Message too large: {size} bytes, at most {max_bytes}.", status_code=413)


@dataclass
class Create:
    """A ``response.create`` message: the request, and whether to generate its answer."""

    request: ResponsesRequest
    generate: bool


def parse_create(text: str) -> Create:
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
    if not generate:
        # `generate: false` is the WebSocket's own way to ask for a prewarm: from here on the
        # request is one (`prompt_cache_options.prewarm`), served as over HTTP.
        options = request.prompt_cache_options or PromptCacheOptions()
        request = request.model_copy(
            update={"prompt_cache_options": options.model_copy(update={"prewarm": True})}
        )
    return Create(request, not is_prewarm(request.prompt_cache_options))


class _Generation(BaseModel):
    """The WebSocket-only field of ``response.create`` that says whether to generate
    (``prompt_cache_options.prewarm``, the shared one, overrides it)."""

    model_config = ConfigDict(**STRICT_TYPES, extra="ignore")
    generate: bool | None = None  # default true


def _generate(body: dict) -> bool:
    try:
        return _Generation.model_validate(body).generate is not False
    except ValidationError as exc:
        raise from_validation_errors(list(exc.errors())) from exc
