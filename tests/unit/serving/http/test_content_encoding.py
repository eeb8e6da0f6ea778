"""Compressed request bodies (serve_app/serving/http/content_encoding.py): a body decoding to
many pieces from one message lets the event loop run between them."""

from __future__ import annotations

import asyncio
import gzip

import pytest
import zstandard
from starlette.types import Message

from serve_app.serving.http.content_encoding import GzipDecoder, ZstdDecoder, decoded_receive

PROSE = b"the quick brown fox jumps over the lazy dog " * 200_000  # 8.8 MB


@pytest.mark.parametrize(
    ("compress", "decoder"),
    [(gzip.compress, GzipDecoder), (zstandard.ZstdCompressor().compress, ZstdDecoder)],
)
async def test_the_loop_runs_between_the_pieces_of_one_message(compress, decoder) -> None:
    sent = [{"type": "http.request", "body": compress(PROSE), "more_body": False}]

    async def receive() -> Message:
        return sent.pop(0)

    ticks = 0
    done = False

    async def tick() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    receive_decoded = decoded_receive(receive, decoder())
    body, pieces, ticks_at_start = b"", 0, ticks
    while True:
        message = await receive_decoded()
        body += message["body"]
        pieces += bool(message["body"])
        if not message["more_body"]:
            break
    done = True
    await ticker
    assert body == PROSE
    assert pieces > 2
    # The ticker ran between every two pieces (without the yield: never, the whole body
    # decodes in one go).
    assert ticks - ticks_at_start >= pieces - 1
