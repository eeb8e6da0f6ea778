"""An SSE response that writes a comment line when it has been silent for a while.

Why: a client that leaves mid-stream must abort its engine request (tests/app/test_disconnect.py),
and the app learns it left from the front: Serve's Python proxy and a settled HAProxy close their
connection to the replica at once. An HAProxy process that Serve has reloaded (it reloads on every
change of the ingress replicas: start-up, a replica replaced, autoscaling) keeps serving the
streams it holds but no longer reads from their clients, so it misses the client's FIN and keeps
the replica's connection open: the engine request ran on until its end or HAProxy's
``hard-stop-after`` (120 s), holding an engine slot. A write is seen by every front: the client's
closed socket answers it with a reset and the front closes the replica's side, which aborts the
request. The turn's events are the writes of a generating stream; this adds one to a stream that
waits (a paused engine, a long prefill, a queue). An SSE comment line (``:`` ...) is ignored by
every SSE parser (the spec; openai-python's, openai-node's, Codex's), so the events are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

# A stream that has sent nothing for between one and two of these writes the comment below.
KEEPALIVE_S = 5.0
KEEPALIVE_COMMENT = b": keep-alive\n\n"


class KeepAliveStreamingResponse(StreamingResponse):
    """``StreamingResponse`` plus, while the body is open, ``KEEPALIVE_COMMENT`` after every
    ``keepalive_s`` of silence. Only between body messages: never before the headers, never after
    the last message, never while the response's own send is under way."""

    def __init__(self, *args, keepalive_s: float = KEEPALIVE_S, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.keepalive_s = keepalive_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        state = _BodyState()

        async def tracked(message: Message) -> None:
            state.sending = True
            try:
                await send(message)
            finally:
                state.sending = False
            state.messages += 1
            if message["type"] == "http.response.start":
                state.open = True
            elif not message.get("more_body", False):
                state.open = False

        beat = asyncio.create_task(self._beat(state, send, asyncio.current_task()))
        try:
            await super().__call__(scope, receive, tracked)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _beat(self, state: _BodyState, send: Send, response: asyncio.Task | None) -> None:
        seen = -1
        while True:
            await asyncio.sleep(self.keepalive_s)
            if state.messages == seen and state.open and not state.sending:
                try:
                    await send(
                        {"type": "http.response.body", "body": KEEPALIVE_COMMENT, "more_body": True}
                    )
                except Exception as exc:  # the connection is gone: end the response (its body)
                    logger.info("sse: keep-alive write failed (%s), ending the stream", exc)
                    if response is not None:
                        response.cancel()
                    return
            seen = state.messages


class _BodyState:
    """What the keep-alive needs to know of the response's own sends."""

    __slots__ = ("messages", "open", "sending")

    def __init__(self) -> None:
        self.messages = 0  # sent so far: unchanged over a whole interval means silent
        self.open = False  # headers sent, last body message not yet
        self.sending = False
