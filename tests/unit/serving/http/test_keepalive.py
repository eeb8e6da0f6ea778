"""The SSE keep-alive (serve_app/serving/http/keepalive.py) on the real response class, through
ASGI: a silent stream writes comment lines that an SSE parser (openai-python's) skips, a flowing
one writes none, and a keep-alive that cannot be written ends the response and its body."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from openai._streaming import SSEDecoder

from serve_app.serving.http.keepalive import KEEPALIVE_COMMENT, KeepAliveStreamingResponse

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "method": "POST"}
TICK = 0.05  # the keep-alive interval in these tests


async def _never_disconnects() -> dict:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


async def _run(body: AsyncIterator[bytes]) -> list[dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    response = KeepAliveStreamingResponse(body, media_type="text/event-stream", keepalive_s=TICK)
    await response(SCOPE, _never_disconnects, send)
    return sent


def _bodies(sent: list[dict]) -> list[bytes]:
    return [message["body"] for message in sent if message["type"] == "http.response.body"]


async def test_a_silent_stream_writes_comments_that_sse_parsers_skip() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"n": 1}\n\n'
        await asyncio.sleep(TICK * 5)  # the engine pauses
        yield b'data: {"n": 2}\n\n'

    sent = await _run(body())
    bodies = _bodies(sent)
    assert sent[0]["type"] == "http.response.start"
    assert bodies.count(KEEPALIVE_COMMENT) >= 1
    assert bodies[0] == b'data: {"n": 1}\n\n' and bodies[-2:] == [b'data: {"n": 2}\n\n', b""]
    assert sent[-1]["more_body"] is False  # nothing after the last message
    events = list(SSEDecoder().iter_bytes(iter([b"".join(bodies)])))
    assert [event.json() for event in events] == [{"n": 1}, {"n": 2}]


async def test_a_flowing_stream_writes_no_comment() -> None:
    async def body() -> AsyncIterator[bytes]:
        for n in range(30):
            yield f"data: {n}\n\n".encode()
            await asyncio.sleep(TICK / 5)

    bodies = _bodies(await _run(body()))
    assert KEEPALIVE_COMMENT not in bodies and len(bodies) == 31


async def test_a_keep_alive_that_cannot_be_written_ends_the_response_and_its_body() -> None:
    closed = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(3600)  # the engine pauses; the client is gone meanwhile
            yield b"data: 2\n\n"
        finally:
            closed.set()  # in the app: aclosing the events, which aborts the engine request

    async def send(message: dict) -> None:
        if message.get("body") == KEEPALIVE_COMMENT:
            raise OSError("connection reset by peer")

    response = KeepAliveStreamingResponse(body(), keepalive_s=TICK)
    running = asyncio.create_task(response(SCOPE, _never_disconnects, send))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running, timeout=5)
    assert closed.is_set()
