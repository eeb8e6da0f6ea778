"""Request-body limits in OpenAI's error shape: a size limit (413), on the body as received and,
for a compressed body (``content_encoding.py``), on the decoded body too; and a deadline for
receiving the body (408).

Pure ASGI, so it sees bodies sent without a Content-Length (chunked) as they arrive, and never
buffers more than the limit. Starlette's own limiter (FastAPI's `max_body_size`) answers a
plain-text 413 and replaces any JSON answer to a request whose Content-Length is too large, so it
cannot give OpenAI's shape.

The deadline: a request holds one of the ingress replica's request slots (Ray Serve's
`max_ongoing_requests`) from its headers on, while the app waits for its body. A client sending
one byte every few seconds would hold it for as long as it likes; past ``timeout_s`` from the
request's start the body is refused instead, and the connection closed.
"""

from __future__ import annotations

import asyncio

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.protocol.errors import error_body
from serve_app.serving.http import content_encoding


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a body passes the limit. An `HTTPException`, so FastAPI's body
    parsing lets it through to the app's handler instead of turning it into a 400."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"Request body too large: at most {max_bytes} bytes.")


class BodyTimeout(HTTPException):
    """Raised from `receive` once the body is late (an `HTTPException`, as `BodyTooLarge`)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(408, f"The request body was not received within {timeout_s:g} seconds.")


class BodyLimits:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

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
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body = _Body(receive, deadline, self.timeout_s, expected=_has_body(headers))
        receive = self._within_limit(body.receive)
        if decoder is not None:
            # The decoded body too: a small compressed body can decode to gigabytes.
            scope = content_encoding.without_encoding(scope)
            receive = self._within_limit(content_encoding.decoded_receive(receive, decoder))
        await self.app(scope, receive, body.closing_if_unread(send))

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


class _Body:
    """The request's body as received by a deadline, and whether it was received whole."""

    def __init__(self, receive: Receive, deadline: float, timeout_s: float, expected: bool) -> None:
        self._receive = receive
        self._deadline = deadline
        self._timeout_s = timeout_s
        self.complete = not expected

    async def receive(self) -> Message:
        if self.complete:
            # Past the body, `receive` only waits for the client to leave (a streamed
            # response listens for it): no deadline there.
            return await self._receive()
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            raise BodyTimeout(self._timeout_s) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.complete = True
        return message

    def closing_if_unread(self, send: Send) -> Send:
        """``send`` that asks the server to close the connection when the response starts
        before the body was received whole (a 408, a 413 mid-body, an early error): otherwise
        it would keep reading the rest of the body, or wait for it."""

        async def send_closing_if_unread(message: Message) -> None:
            if message["type"] == "http.response.start" and not self.complete:
                MutableHeaders(scope=message)["connection"] = "close"
            await send(message)

        return send_closing_if_unread


def _has_body(headers: Headers) -> bool:
    declared = headers.get("content-length")
    if declared is not None:
        return declared.strip() != "0"
    return "transfer-encoding" in headers


async def _refuse(error: HTTPException, scope: Scope, receive: Receive, send: Send) -> None:
    body = error_body(error.detail, "invalid_request_error")
    response = JSONResponse(body, status_code=error.status_code, headers={"connection": "close"})
    await response(scope, receive, send)
