"""A request-body size limit that answers 413 in OpenAI's error shape.

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
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            # Refused before a byte of the body is read.
            await self._refuse(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, receive_within_limit, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = BodyTooLarge(self.max_bytes)
        response = JSONResponse(error_body(error.detail, "invalid_request_error"), status_code=413)
        await response(scope, receive, send)
