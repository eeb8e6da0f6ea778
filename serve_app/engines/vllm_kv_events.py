"""The vLLM engine's KV-cache events, received in the engine replica's own process.

vLLM's scheduler (in its engine-core process, a child of the replica) publishes a batch of
KV-cache events each step on a ZMQ PUB socket (``vllm/distributed/kv_events.py``:
``ZmqEventPublisher``, multipart ``(topic, 8-byte sequence number, msgpack KVEventBatch)``).
The engine replica configures that publisher on an ``ipc://`` endpoint of its own (vLLM binds
ipc endpoints; the default ``tcp://*:5557`` would collide between replicas of one node), and
`KVEventSubscriber` reads it on the replica's event loop (``zmq.asyncio``), decodes each batch
with vLLM's own msgspec types and hands the events, as ``serve_app.engines.kv_events``, to the
sinks (the engine deployment's KV summary). No other process is involved: no indexer service,
no TCP port. A gap in the sequence numbers (the publisher's high-water mark dropped batches)
is logged and counted; the summary then lags until the blocks concerned are stored or
removed again. What vLLM 0.32 and 0.33 send: docs/vllm.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import uuid
from collections.abc import Sequence
from typing import Any

from serve_app.engines.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventSink,
)

logger = logging.getLogger(__name__)

TOPIC = "serve_app.kv"


def new_endpoint() -> str:
    """An ``ipc://`` endpoint no other replica uses (a socket file in the temp directory)."""
    return f"ipc://{os.path.join(tempfile.gettempdir(), f'serve_app-kv-{uuid.uuid4().hex}')}"


def kv_events_config(endpoint: str) -> dict[str, Any]:
    """vLLM's ``KVEventsConfig`` fields for a ZMQ publisher on ``endpoint``."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "topic": TOPIC,
    }


def convert(event: Any) -> KVEvent | None:
    """Ours for one of vLLM's events (None for a kind we do not know)."""
    match type(event).__name__:
        case "BlockStored":
            return BlockStored(
                tuple(event.block_hashes),
                event.parent_block_hash,
                event.block_size,
                getattr(event, "session_id", None),
                getattr(event, "group_idx", None),
                getattr(event, "kv_cache_spec_kind", None),
            )
        case "BlockRemoved":
            return BlockRemoved(tuple(event.block_hashes), getattr(event, "group_idx", None))
        case "AllBlocksCleared":
            return AllBlocksCleared()
    return None


class KVEventSubscriber:
    """Reads the engine core's KV-event publisher on ``endpoint`` into ``sinks``."""

    def __init__(self, endpoint: str, sinks: Sequence[KVEventSink]) -> None:
        self.endpoint = endpoint
        self._sinks = sinks
        self.batches = 0
        self.gaps = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._read(), name="vLLM KV-event subscriber")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.endpoint.startswith("ipc://"):
            with contextlib.suppress(OSError):  # vLLM's socket file, if it left it
                os.unlink(self.endpoint.removeprefix("ipc://"))

    async def _read(self) -> None:
        import msgspec
        import zmq
        import zmq.asyncio
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        context = zmq.asyncio.Context.instance()
        socket = context.socket(zmq.SUB)
        socket.connect(self.endpoint)  # before vLLM binds is fine: ZMQ connects when it can
        socket.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        expected: int | None = None
        try:
            while True:
                _topic, sequence, payload = await socket.recv_multipart()
                number = int.from_bytes(sequence, "big", signed=True)
                if expected is not None and number != expected:
                    self.gaps += 1
                    logger.warning("vLLM KV events %d to %d lost", expected, number - 1)
                expected = number + 1
                try:
                    batch = decoder.decode(payload)
                except msgspec.DecodeError:
                    logger.exception("an undecodable vLLM KV-event batch; skipped")
                    continue
                events = [ours for ours in map(convert, batch.events) if ours is not None]
                self.batches += 1
                for sink in self._sinks:
                    try:
                        sink(events)
                    except Exception:  # a summary's bug loses these events, not the reader
                        logger.exception("a KV-event sink failed")
        finally:
            socket.close(linger=0)
