"""Request bodies sent with ``Content-Encoding: gzip`` or ``zstd``, decoded as they arrive.

OpenAI accepts compressed request bodies; so does this server, for ``gzip`` and ``zstd``
(``identity`` is the plain body). Any other coding is refused with a 415 before the body is read.
Decoding is incremental and each step's output is bounded, so the body size limit
(``body_limit.py``) counts decoded bytes as they come: a decompression bomb is a 413 after about
the limit's worth of output, never decoded whole. The event loop runs between two pieces.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from typing import Protocol

import zstandard
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope

SUPPORTED = ("gzip", "zstd")
# Decoded bytes per step at most (gzip); zstd is fed this many compressed bytes per step,
# which a zstd block can expand ~32,000 times: a few MiB at most.
STEP = 64 * 1024
ZSTD_INPUT_STEP = 128
_GZIP_WBITS = 16 + zlib.MAX_WBITS


class UnsupportedEncoding(HTTPException):
    def __init__(self, coding: str) -> None:
        super().__init__(
            415,
            f"Unsupported Content-Encoding '{coding}': send the body plain (identity), "
            f"or compressed with one of {', '.join(SUPPORTED)}.",
        )


class UndecodableBody(HTTPException):
    """Raised from ``receive``: an `HTTPException`, so FastAPI lets it through to the app's
    handler (as `BodyTooLarge`)."""

    def __init__(self, coding: str) -> None:
        super().__init__(400, f"The request body is not valid {coding} data.")


class Decoder(Protocol):
    def decode(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of ``data`` (the next compressed bytes), a bounded piece at a time."""
        ...

    def finish(self) -> None:
        """The body ended: raise `UndecodableBody` if it ended inside a compressed stream."""
        ...


def decoder_for(headers: Headers) -> Decoder | None:
    """The decoder a request's Content-Encoding needs; None for a plain body."""
    codings = [
        coding.strip().lower()
        for coding in headers.get("content-encoding", "").split(",")
        if coding.strip().lower() not in ("", "identity")
    ]
    if not codings:
        return None
    if codings == ["gzip"] or codings == ["x-gzip"]:
        return GzipDecoder()
    if codings == ["zstd"]:
        return ZstdDecoder()
    raise UnsupportedEncoding(", ".join(codings))


def without_encoding(scope: Scope) -> Scope:
    """The request as the app sees it once decoded: no Content-Encoding, and no Content-Length
    (that of the compressed body)."""
    headers = [
        (name, value)
        for name, value in scope["headers"]
        if name.lower() not in (b"content-encoding", b"content-length")
    ]
    return {**scope, "headers": headers}


def decoded_receive(receive: Receive, decoder: Decoder) -> Receive:
    """``receive`` giving the decoded body, one bounded piece per message."""
    pieces: Iterator[bytes] = iter(())
    more_body = True

    async def receive_decoded() -> Message:
        nonlocal pieces, more_body
        while True:
            piece = next(pieces, None)
            if piece is not None:
                # One message's pieces follow with no wait for the network between them: let
                # the event loop run between two (a 1.5 kB zstd body decodes to 16 MB in
                # about 60 ms; one piece, a few ms).
                await asyncio.sleep(0)
                return {"type": "http.request", "body": piece, "more_body": True}
            if not more_body:
                decoder.finish()
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return message
            more_body = message.get("more_body", False)
            pieces = decoder.decode(message.get("body", b""))

    return receive_decoded


class GzipDecoder:
    """gzip, one member after another (a body may hold several)."""

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj(_GZIP_WBITS)

    def decode(self, data: bytes) -> Iterator[bytes]:
        while True:
            if self._inflate.eof:
                data = self._inflate.unused_data + data
                if not data:
                    return
                self._inflate = zlib.decompressobj(_GZIP_WBITS)
            try:
                out = self._inflate.decompress(data, STEP)
            except zlib.error as exc:
                raise UndecodableBody("gzip") from exc
            consumed = len(data) - len(self._inflate.unconsumed_tail)
            data = self._inflate.unconsumed_tail
            if out:
                yield out
            elif not self._inflate.eof and (not data or not consumed):
                return  # all input taken, no output pending: wait for more

    def finish(self) -> None:
        if not self._inflate.eof:
            raise UndecodableBody("gzip")


class ZstdDecoder:
    """zstd, one frame after another. The library's decompressor has no output bound, so the
    input is fed in small steps instead."""

    def __init__(self) -> None:
        self._frame = zstandard.ZstdDecompressor().decompressobj()

    def decode(self, data: bytes) -> Iterator[bytes]:
        for start in range(0, len(data), ZSTD_INPUT_STEP):
            step = data[start : start + ZSTD_INPUT_STEP]
            while step:
                if self._frame.eof:
                    self._frame = zstandard.ZstdDecompressor().decompressobj()
                try:
                    out = self._frame.decompress(step)
                except zstandard.ZstdError as exc:
                    raise UndecodableBody("zstd") from exc
                step = self._frame.unused_data if self._frame.eof else b""
                if out:
                    yield out

    def finish(self) -> None:
        if not self._frame.eof:
            raise UndecodableBody("zstd")
