"""The vLLM engine's KV-cache events, received in the engine replica's own process.

vLLM's scheduler (in its engine-core process, a child of the replica) publishes a batch of
KV-cache events each step on a ZMQ PUB socket (``vllm/distributed/kv_events.py``:
``ZmqEventPublisher``, multipart ``(topic, 8-byte sequence number, msgpack KVEventBatch)``),
and keeps the last ``buffer_steps`` batches for replay on a ROUTER socket. The engine replica
configures that publisher on two ``ipc://`` endpoints of its own (vLLM binds ipc endpoints; the
default ``tcp://*:5557`` would collide between replicas of one node), and `KVEventSubscriber`
reads it on the replica's event loop (``zmq.asyncio``), decodes each batch with vLLM's own
msgspec types and hands the events, as ``serve_app.engines.kv_events``, to the sinks (the
engine deployment's KV summary). No other process is involved: no indexer service, no TCP
port.

Batches are numbered from 0. A gap in the numbers (the PUB socket's high-water mark dropped
batches, or they went out before the subscription reached the publisher) is filled from the
replay socket; batches the replay no longer has are counted lost and the sinks get an
``EventsLost`` in their place (the summary then forgets what it held, see
``serve_app.routing.kv_summary``). An event of a kind we do not know (a newer vLLM) is logged
once per kind and skipped; the rest of its batch is kept. Events of every tier are converted,
each with its ``medium`` (the GPU pool's as None, an offloading tier's as vLLM names it: "CPU"
for the OffloadingConnector's CPU tier). What vLLM 0.32 and 0.33 send: docs/vllm.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from serve_app.engines.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventsLost,
    KVEvent,
    KVEventSink,
)

logger = logging.getLogger(__name__)

TOPIC = "serve_app.kv"
# The replay's last frame (vLLM's ZmqEventPublisher.END_SEQ).
END_SEQ = -1
# How long a replay may take; the publisher thread answers between two engine steps' batches
# (it polls its replay socket at least every 0.1 s).
REPLAY_TIMEOUT_S = 2.0
# vLLM's medium for its own block pool (BlockPool.medium: MEDIUM_GPU, on the CPU build too);
# None from a vLLM that names no medium. Offloading tiers (the OffloadingConnector's "CPU" and
# "STORAGE") send their own copies of the pool's blocks, by the same hashes.
GPU_MEDIUM = "GPU"


def new_endpoint() -> str:
    """An ``ipc://`` endpoint no other replica uses (a socket file in the temp directory)."""
    return f"ipc://{os.path.join(tempfile.gettempdir(), f'serve_app-kv-{uuid.uuid4().hex}')}"


def replay_endpoint(endpoint: str) -> str:
    """The replay socket's endpoint next to the publisher's ``endpoint``."""
    return f"{endpoint}-replay"


def kv_events_config(endpoint: str) -> dict[str, Any]:
    """vLLM's ``KVEventsConfig`` fields for a ZMQ publisher on ``endpoint``, with its replay
    socket on `replay_endpoint` (``buffer_steps``: vLLM's default, 10,000 batches)."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay_endpoint(endpoint),
        "topic": TOPIC,
    }


def medium_of(event: Any) -> str | None:
    """The tier an event's copy lives in: None (the GPU pool) for vLLM's pool and for a vLLM
    that names none, else the offloading tier's medium ("CPU", "STORAGE")."""
    value = getattr(event, "medium", None)
    return None if value in (None, GPU_MEDIUM) else value


def convert(event: Any) -> KVEvent | None:
    """Ours for one of vLLM's events, whatever its tier (``medium``: None for the GPU pool, so
    a summary that counts by medium never takes a CPU copy's removal for the pool's); None for
    a kind we do not know. An offloading tier's ``BlockStored`` names no session (the connector
    stores blocks, not requests: the summary finds their conversations by hash) and may carry
    ``block_size`` 0 (vLLM's placeholder for a chunk it kept no metadata of). LoRA fields are
    not kept: vLLM's block hashes already include the adapter, and the summary keys blocks by
    hash and conversation."""
    kind = type(event).__name__
    match kind:
        case "BlockStored":
            return BlockStored(
                tuple(event.block_hashes),
                event.parent_block_hash,
                event.block_size,
                getattr(event, "session_id", None),
                getattr(event, "group_idx", None),
                getattr(event, "kv_cache_spec_kind", None),
                medium_of(event),
            )
        case "BlockRemoved":
            return BlockRemoved(
                tuple(event.block_hashes), getattr(event, "group_idx", None), medium_of(event)
            )
        case "AllBlocksCleared":
            return AllBlocksCleared()
    logger.warning("a vLLM KV event of an unknown kind, %s, skipped", kind)
    return None


@functools.cache
def _batch_decoders() -> tuple[Any, Any]:
    """msgspec decoders for a batch whose events stay raw, and for one of vLLM's events: each
    event is decoded on its own, so one of a kind we do not know loses only itself."""
    import msgspec
    from vllm.distributed.kv_events import AllBlocksCleared as VllmCleared
    from vllm.distributed.kv_events import BlockRemoved as VllmRemoved
    from vllm.distributed.kv_events import BlockStored as VllmStored

    # vLLM's EventBatch with its events left undecoded (defstruct: this module's annotations
    # are strings, which msgspec would resolve in its globals).
    raw_batch = msgspec.defstruct(
        "RawBatch",
        [("ts", float), ("events", list[msgspec.Raw]), ("data_parallel_rank", int | None, None)],
        array_like=True,
    )
    return (
        msgspec.msgpack.Decoder(raw_batch),
        msgspec.msgpack.Decoder(VllmStored | VllmRemoved | VllmCleared),
    )


class BatchDecoder:
    """Ours for the events of one published batch (its msgpack payload)."""

    def __init__(self) -> None:
        self.unknown: Counter[str] = Counter()  # events skipped, by their tag

    def __call__(self, payload: bytes) -> list[KVEvent]:
        """Raises msgspec's DecodeError if the batch itself is undecodable."""
        import msgspec

        batch_decoder, event_decoder = _batch_decoders()
        events: list[KVEvent] = []
        for raw in batch_decoder.decode(payload).events:
            try:
                event = event_decoder.decode(raw)
            except msgspec.DecodeError as exc:
                self._skipped(raw, exc)
                continue
            ours = convert(event)
            if ours is not None:
                events.append(ours)
        return events

    def _skipped(self, raw: Any, error: Exception) -> None:
        import msgspec

        try:
            tag = str(msgspec.msgpack.decode(raw).get("type"))
        except (msgspec.DecodeError, AttributeError):
            tag = "undecodable"
        self.unknown[tag] += 1
        if self.unknown[tag] == 1:  # once per kind: a newer vLLM sends it every step
            logger.warning("vLLM KV events of kind %s are skipped: %s", tag, error)


def _log_failure(task: asyncio.Task) -> None:
    """The reader should only end cancelled; if it failed, the summary is frozen: say so."""
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "the vLLM KV-event subscriber failed: the KV summary no longer follows the engine",
            exc_info=task.exception(),
        )


def _number(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


class KVEventSubscriber:
    """Reads the engine core's KV-event publisher on ``endpoint`` into ``sinks``, filling gaps
    from its replay socket on ``replay``."""

    def __init__(
        self,
        endpoint: str,
        sinks: Sequence[KVEventSink],
        replay: str | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint
        self.replay = replay
        self._sinks = sinks
        self._replay_timeout_s = replay_timeout_s
        self.decoder = BatchDecoder()
        self.batches = 0  # batches handed to the sinks, replayed ones included
        self.replayed = 0  # batches the replay socket filled a gap with
        self.lost = 0  # batches neither received nor replayed
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._read(), name="vLLM KV-event subscriber")
        self._task.add_done_callback(_log_failure)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # A reader that failed was logged when it did (`_log_failure`): stopping goes on.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for endpoint in (self.endpoint, self.replay):
            if endpoint is not None and endpoint.startswith("ipc://"):
                with contextlib.suppress(OSError):  # vLLM's socket file, if it left it
                    os.unlink(endpoint.removeprefix("ipc://"))

    async def _read(self) -> None:
        import zmq
        import zmq.asyncio

        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.connect(self.endpoint)  # before vLLM binds is fine: ZMQ connects when it can
        socket.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        expected = 0  # the publisher numbers its batches from 0
        try:
            while True:
                frames = await socket.recv_multipart()
                if len(frames) != 3:  # not vLLM's (topic, number, payload): skip, keep reading
                    logger.warning("a KV-event message of %d frames skipped", len(frames))
                    continue
                _topic, sequence, payload = frames
                number = _number(sequence)
                if number < expected:
                    # A new publisher (the engine core restarted): its cache starts empty.
                    logger.warning("vLLM KV events restart at %d (expected %d)", number, expected)
                    self._deliver([AllBlocksCleared()])
                    expected = 0
                if number > expected:
                    await self._fill(expected, number)
                self._apply(payload)
                expected = number + 1
        finally:
            socket.close(linger=0)

    async def _fill(self, first: int, end: int) -> None:
        """Batches ``first`` to ``end - 1`` never arrived: replay them, in order; for each run
        of those the replay does not have, the sinks get an `EventsLost`."""
        replayed = await self._replayed(first, end)
        missing = 0
        for number in range(first, end):
            payload = replayed.get(number)
            if payload is None:
                missing += 1
                continue
            self._lost(number, missing)
            missing = 0
            self.replayed += 1
            self._apply(payload)
        self._lost(end, missing)
        if replayed:
            logger.info(
                "vLLM KV events %d to %d missed, %d replayed", first, end - 1, len(replayed)
            )

    def _lost(self, before: int, count: int) -> None:
        """The ``count`` batches before batch ``before`` are lost."""
        if count:
            self.lost += count
            logger.warning(
                "vLLM KV events %d to %d lost (not in the replay buffer): the KV summary "
                "starts over",
                before - count,
                before - 1,
            )
            self._deliver([EventsLost(count)])

    async def _replayed(self, first: int, end: int) -> dict[int, bytes]:
        """What the publisher's replay socket still has of batches ``first`` to ``end - 1``."""
        import zmq
        import zmq.asyncio

        got: dict[int, bytes] = {}
        if self.replay is None:
            return got
        # A socket per replay: a late answer to an earlier one cannot end this one early.
        socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        socket.connect(self.replay)
        try:
            async with asyncio.timeout(self._replay_timeout_s):
                await socket.send_multipart([b"", first.to_bytes(8, "big")])
                while True:
                    frames = await socket.recv_multipart()  # b"", topic, number, payload
                    number = _number(frames[2]) if len(frames) == 4 else END_SEQ
                    if number == END_SEQ:
                        break
                    if first <= number < end:
                        got[number] = frames[3]
                    if number >= end - 1:
                        break  # in order: no batch wanted comes after this one
        except TimeoutError:
            logger.warning("vLLM's KV-event replay did not answer in %ss", self._replay_timeout_s)
        finally:
            socket.close(linger=0)
        return got

    def _apply(self, payload: bytes) -> None:
        import msgspec

        try:
            events = self.decoder(payload)
        except msgspec.DecodeError:
            logger.exception("an undecodable vLLM KV-event batch: counted lost")
            self.lost += 1
            events = [EventsLost(1)]
        self.batches += 1
        self._deliver(events)

    def _deliver(self, events: list[KVEvent]) -> None:
        for sink in self._sinks:
            try:
                sink(events)
            except Exception:  # a summary's bug loses these events, not the reader
                logger.exception("a KV-event sink failed")
