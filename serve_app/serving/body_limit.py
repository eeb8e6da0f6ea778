"""A request-body size limit that answers 413 in OpenAI's error shape, on the body as received
and, for a compressed body (``content_encoding.py``), on the decoded body too.

Pure ASGI, so it sees bodies sent without a Content-Length (chunked) as they arrive, and never
buffers more than the limit. Starlette's own limiter (FastAPI's `max_body_size`) answers a
plain-text 413 and replaces any JSON answer to a request whose Content-Length is too large, so it
cannot give OpenAI's shape.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.protocol.errors import error_body
from serve_app.serving import content_encoding


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a body passes the limit. An `HTTPException`, so FastAPI's body
    parsing lets it through to the app's handler instead of turning it into a 400."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"Request body too large: at most {max_bytes} bytes.")


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            # Refused before a byte of the body is read.
            await _refuse(BodyTooLarge(self.max_bytes), scope, receive, send)
            return
        try:
            decoder = content_encoding.decoder_for(headers)
        except content_encoding.UnsupportedEncoding as unsupported:
            await _refuse(unsupported, scope, receive, send)
            return
        receive = self._within_limit(receive)
        if decoder is not None:
            # The decoded body too: a small compressed body can decode to gigabytes.
            scope = content_encoding.without_encoding(scope)
            receive = self._within_limit(content_encoding.decoded_receive(receive, decoder))
        await self.app(scope, receive, send)

    def _within_limit(self, receive: Receive) -> Receive:
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            return message

        return receive_within_limit


async def _refuse(error: HTTPException, scope: Scope, receive: Receive, send: Send) -> None:
    body = error_body(error.detail, "invalid_request_error")
    await JSONResponse(body, status_code=error.status_code)(scope, receive, send)
