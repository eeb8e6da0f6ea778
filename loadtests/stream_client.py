"""The benchmarks' light streaming client: one streamed response over raw HTTP/1.1, timed as
its bytes arrive (no JSON parsed but the terminal event's), and what it saw (`Stream`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_app.protocol.sse import TERMINAL_EVENT_TYPES

# A read that carries any delta event (text, reasoning, arguments) counts as a delivery.
ANY_DELTA = b"delta\ndata: "
# Only the answer's text: what a server that streams reasoning otherwise is compared on.
TEXT_DELTA = b"output_text.delta\ndata: "


@dataclass
class Stream:
    """What one client saw of one streamed response."""

    sent_at: float = 0.0
    first_at: float = 0.0
    last_at: float = 0.0
    tokens: int = 0
    deliveries: int = 0  # reads (SSE) or messages (WebSocket) that carried delta events
    gaps_s: list[float] = field(default_factory=list)
    status: str = ""

    def delivered(self, now: float) -> None:
        if self.first_at:
            self.gaps_s.append(now - self.last_at)
        else:
            self.first_at = now
        self.last_at = now
        self.deliveries += 1

    def finished(self, event: dict) -> None:
        self.status = event["response"]["status"]
        usage = event["response"].get("usage") or {}
        self.tokens = usage.get("output_tokens", 0)

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens after the first, per second after the first delta."""
        if self.tokens < 2 or self.last_at <= self.first_at:
            return None
        return (self.tokens - 1) / (self.last_at - self.first_at)


class ChunkedBody:
    """An HTTP/1.1 body in the chunked transfer coding, decoded as its bytes arrive: a size
    line's framing must not land inside an event (a large one spans several chunks)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._left = 0  # bytes of the current chunk still to come
        self._crlf = False  # the CRLF after a chunk's data is next
        self.done = False  # the last (empty) chunk came

    def feed(self, data: bytes) -> bytes:
        """The body's bytes ``data`` completes (none while only framing arrived)."""
        self._buffer += data
        body = []
        while not self.done:
            if self._left:
                piece = self._buffer[: self._left]
                body.append(piece)
                self._left -= len(piece)
                self._buffer = self._buffer[len(piece) :]
                if self._left:
                    break
                self._crlf = True
            if self._crlf:
                if len(self._buffer) < 2:
                    break
                self._buffer, self._crlf = self._buffer[2:], False
            line_end = self._buffer.find(b"\r\n")
            if line_end < 0:
                break
            size = int(self._buffer[:line_end].split(b";", 1)[0], 16)
            self._buffer = self._buffer[line_end + 2 :]
            self._left = size
            self.done = size == 0
        return b"".join(body)


async def sse_stream(port: int, body: Mapping[str, Any], delta_marker: bytes = ANY_DELTA) -> Stream:
    """POST ``body`` to ``/v1/responses`` on ``port`` and read its SSE stream to the end."""
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    stream = Stream(sent_at=time.perf_counter())
    writer.write(head + data)
    headers: bytes | None = b""  # until the body starts
    chunked: ChunkedBody | None = None
    pending = b""
    try:
        while chunk := await reader.read(1 << 16):
            now = time.perf_counter()
            if headers is not None:
                headers += chunk
                split = headers.find(b"\r\n\r\n")
                if split < 0:
                    continue
                chunk, headers = headers[split + 4 :], headers[:split].lower()
                if b"transfer-encoding: chunked" in headers:
                    chunked = ChunkedBody()
                headers = None
            pending += chunked.feed(chunk) if chunked is not None else chunk
            end = pending.rfind(b"\n\n")
            if end < 0:
                continue
            complete, pending = pending[: end + 2], pending[end + 2 :]
            if delta_marker in complete:
                stream.delivered(now)
            for name in TERMINAL_EVENT_TYPES:
                marker = f"event: {name}\ndata: ".encode()
                if marker in complete:
                    stream.finished(json.loads(complete.split(marker, 1)[1].split(b"\n", 1)[0]))
                    return stream
    finally:
        writer.close()
    return stream
