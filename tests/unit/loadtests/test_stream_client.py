"""loadtests/stream_client.py: the benchmarks' streaming client reads a chunked SSE body
whatever its chunks and reads split, a large event spanning several chunks included."""

from __future__ import annotations

import asyncio
import json
import random
import sys

import pytest

from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
from stream_client import TEXT_DELTA, ChunkedBody, sse_stream


def sse(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def chunked(body: bytes, sizes: list[int]) -> bytes:
    """``body`` in the chunked transfer coding, its chunks of ``sizes`` (cycled)."""
    out, position, turn = [], 0, 0
    while position < len(body):
        piece = body[position : position + sizes[turn % len(sizes)]]
        out.append(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
        position, turn = position + len(piece), turn + 1
    return b"".join(out) + b"0\r\n\r\n"


BODY = b"".join(
    [
        *(sse("response.output_text.delta", {"delta": f"word {i} "}) for i in range(20)),
        sse(
            "response.completed",
            {"response": {"status": "completed", "usage": {"output_tokens": 20}}, "x": "y" * 9000},
        ),
    ]
)


@pytest.mark.parametrize("seed", range(20))
def test_the_body_is_decoded_whatever_the_chunks_and_the_reads(seed: int) -> None:
    rng = random.Random(seed)
    wire = chunked(BODY, [rng.randint(1, 4000) for _ in range(5)])
    decoder, decoded, position = ChunkedBody(), [], 0
    while position < len(wire):
        step = rng.randint(1, 700)
        decoded.append(decoder.feed(wire[position : position + step]))
        position += step
    assert b"".join(decoded) == BODY and decoder.done


async def serve_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    wire = chunked(BODY, [700, 3000])  # the terminal event spans four chunks
    for position in range(0, len(wire), 1000):
        writer.write(wire[position : position + 1000])
        await writer.drain()
        await asyncio.sleep(0.001)
    writer.close()


async def test_a_large_event_across_chunks_is_read_whole() -> None:
    server = await asyncio.start_server(serve_chunked, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        stream = await sse_stream(port, {"input": "hi"}, TEXT_DELTA)
    assert stream.status == "completed" and stream.tokens == 20
    assert stream.first_at > stream.sent_at
