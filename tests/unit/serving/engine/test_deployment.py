"""The engine deployment's stream: coalesces what a slow reader has not taken, adds no delay,
ends with an error chunk keeping the engine error's code (as the in-process client does), and
aborts the requests of a caller that died."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from serve_app.engines.base import EngineError, GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.routing.directory import TTL_KEY
from serve_app.routing.kv_summary import HELD_KEY, KV_EVENTS_KEY
from serve_app.routing.prefill import DECODING_KEY, QUEUED_KEY, RATE_KEY
from serve_app.routing.replica_report import CPU_HELD_KEY, KV_LOAD_RATE_KEY
from serve_app.routing.ring import stable_hash
from serve_app.serving.engine.channel import Outbox
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.engine.deployment import _END, EngineDeployment, _Route
from serve_app.serving.engine.liveness import Accepted

Replica = EngineDeployment.func_or_class  # the plain class behind the Serve deployment


async def test_queued_chunks_go_out_as_one() -> None:
    route = _Route("r1", "engine-1")
    for tokens in ([1], [2, 3], [4]):
        route.queue.put_nowait(
            GenerateChunk(token_ids=tokens, num_prompt_tokens=9, num_cached_tokens=4)
        )
    chunk = await route.next_chunk()
    assert chunk.token_ids == [1, 2, 3, 4]
    assert (chunk.num_prompt_tokens, chunk.num_cached_tokens) == (9, 4)


async def test_a_finished_chunk_is_not_merged_past_and_the_end_is_kept() -> None:
    route = _Route("r1", "engine-1")
    route.queue.put_nowait(GenerateChunk(token_ids=[1]))
    route.queue.put_nowait(GenerateChunk(token_ids=[2], finish_reason="stop"))
    route.queue.put_nowait(_END)
    chunk = await route.next_chunk()
    assert chunk.token_ids == [1, 2] and chunk.finish_reason == "stop"
    assert await route.next_chunk() is None


async def test_a_reader_that_keeps_up_gets_each_chunk_without_waiting() -> None:
    route = _Route("r1", "engine-1")
    reader = asyncio.create_task(route.next_chunk())
    await asyncio.sleep(0)
    route.queue.put_nowait(GenerateChunk(token_ids=[7]))
    chunk = await asyncio.wait_for(reader, timeout=1)
    assert chunk.token_ids == [7]  # sent as soon as it exists, alone


class _SlowFirstTokenEngine:
    """Yields a chunk without tokens (prompt counts), then tokens after a prefill's wait."""

    async def generate(self, request):
        yield GenerateChunk(num_prompt_tokens=5)
        await asyncio.sleep(0.05)
        yield GenerateChunk(token_ids=[1])
        yield GenerateChunk(token_ids=[2], finish_reason="stop")


async def test_the_first_token_carries_the_time_the_engine_took_to_produce_it() -> None:
    replica = SimpleNamespace(_engine=_SlowFirstTokenEngine())  # only what _produce reads
    sent: list[tuple[GenerateChunk, bool]] = []
    await Replica._produce(replica, None, lambda *chunk_and_flag: sent.append(chunk_and_flag))
    chunks = [chunk for chunk, _ in sent]
    # The chunk holding the first token is the one a channel sends without waiting its window.
    assert [first_token for _, first_token in sent] == [False, True, False]
    assert chunks[0].engine_ttft_s is None  # no token yet
    assert 0.05 <= chunks[1].engine_ttft_s < 1
    assert chunks[2].engine_ttft_s is None  # only the first token is stamped
    assert chunks[0].merge(chunks[1]).merge(chunks[2]).engine_ttft_s == chunks[1].engine_ttft_s


class _ModelledTimeEngine:
    """Yields its first token stamped with a time from its own model, as the simulated one does."""

    async def generate(self, request):
        yield GenerateChunk(token_ids=[1], engine_ttft_s=0.25)
        yield GenerateChunk(token_ids=[2], finish_reason="stop")


async def test_an_engine_that_models_its_time_keeps_its_first_token_time() -> None:
    replica = SimpleNamespace(_engine=_ModelledTimeEngine())
    sent: list[GenerateChunk] = []
    await Replica._produce(replica, None, lambda chunk, _: sent.append(chunk))
    assert sent[0].engine_ttft_s == 0.25  # not the few microseconds it took here


class _FailingEngine:
    """Raises ``error`` after one token, as an engine rejecting or failing a request does."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def generate(self, request):
        yield GenerateChunk(token_ids=[1])
        raise self.error

    async def abort(self, request_id: str) -> None:
        pass


async def test_an_engine_error_ends_the_stream_with_its_code_on_a_replica_and_in_process() -> None:
    request = SimpleNamespace(request_id="r1")
    for error, code, message in (
        (EngineError("too long", code="invalid_prompt"), "invalid_prompt", "too long"),
        (RuntimeError("internal detail"), "server_error", "RuntimeError"),
    ):
        on_replica: list[GenerateChunk] = []
        replica = SimpleNamespace(_engine=_FailingEngine(error))
        await Replica._produce(replica, request, lambda c, _, sent=on_replica: sent.append(c))
        in_process = [c async for c in InProcessEngineClient(_FailingEngine(error)).stream(request)]
        accepted, *in_process = in_process  # in process, taken at once: an empty first chunk
        assert accepted == GenerateChunk()
        for chunks in (on_replica, in_process):
            assert [chunk.finish_reason for chunk in chunks] == [None, "error"]
            assert (chunks[-1].error, chunks[-1].error_code) == (message, code)


# --- a caller that died: its requests are aborted ------------------------------------------


class _BareReplica(Replica):
    def __del__(self) -> None:  # Serve awaits the real one; this instance has nothing to free
        pass


def _replica_with(engine: SimulatedEngine, live: set[str] | None) -> Any:
    """The deployment's instance without Serve, its callers listed from ``live`` (None: the
    listing fails, as when the GCS cannot be reached)."""

    async def live_callers() -> set[str]:
        if live is None:
            raise ConnectionError("GCS unreachable")
        return set(live)

    replica = _BareReplica.__new__(_BareReplica)
    replica._serve(engine, "engine-1", live_callers, caller_check_period_s=0.1)
    return replica


async def _long_engine() -> SimulatedEngine:
    engine = SimulatedEngine(
        SimulatedEngineConfig(decode_tokens_per_s=20, default_output_tokens=400)
    )
    await engine.start()
    return engine


def _request(request_id: str) -> GenerateRequest:
    return GenerateRequest(request_id, [200006, 1428, 200008, 12194, 200007], SamplingSettings(400))


async def _read(stream: AsyncIterator[GenerateChunk | Accepted]) -> list[GenerateChunk]:
    """A request's own stream, read to its end: its chunks after the replica's `Accepted`."""
    accepted, *chunks = [item async for item in stream]
    assert isinstance(accepted, Accepted)
    return chunks


@pytest.mark.parametrize("listing", ["caller gone", "listing fails"])
async def test_the_requests_of_a_caller_that_died_are_aborted(listing: str) -> None:
    engine = await _long_engine()
    live = {"ingress-1", "ingress-2"}
    replica = _replica_with(engine, live if listing == "caller gone" else None)
    try:
        orphan = asyncio.create_task(_read(replica.generate(_request("r1"), caller="ingress-1")))
        kept = asyncio.create_task(_read(replica.generate(_request("r2"), caller="ingress-2")))
        await asyncio.sleep(0.3)
        assert engine.num_ongoing_requests() == 2
        live.discard("ingress-1")  # its replica died
        if listing == "listing fails":  # nothing is aborted on a guess
            await asyncio.sleep(0.5)
            assert engine.num_ongoing_requests() == 2 and not orphan.done()
            return
        chunks = await asyncio.wait_for(orphan, timeout=1)  # its stream ends here too
        assert not any(chunk.finish_reason for chunk in chunks)
        assert engine.num_ongoing_requests() == 1 and not kept.done()
        assert replica._callers._requests == {"ingress-2": {"r2"}}
    finally:
        await engine.shutdown()
        for task in (orphan, kept):
            task.cancel()


async def test_requests_without_a_caller_or_finished_are_not_watched() -> None:
    engine = await _long_engine()
    replica = _replica_with(engine, set())  # nobody is alive: only unwatched requests survive
    try:
        unwatched = asyncio.create_task(_read(replica.generate(_request("r1"))))
        await asyncio.sleep(0.3)
        assert engine.num_ongoing_requests() == 1 and not unwatched.done()
        assert replica._callers._requests == {}
    finally:
        unwatched.cancel()
        await engine.shutdown()


# --- an item a request's queue must not hold: that request fails, logged; nothing else -------


async def test_an_unexpected_item_on_the_own_stream_ends_the_request_with_a_server_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    route = _Route("r1", "engine-1")
    route.queue.put_nowait(GenerateChunk(token_ids=[1]))
    route.queue.put_nowait(object())  # past `send`'s types: a bug elsewhere
    route.queue.put_nowait(GenerateChunk(token_ids=[2]))
    chunk = await route.next_chunk()
    assert chunk.token_ids == [1]  # what came before it still goes out, then its end
    assert (chunk.finish_reason, chunk.error_code) == ("error", "server_error")
    assert route.failed
    route.send(GenerateChunk(token_ids=[3]), False)  # its error chunk was its last
    assert route.queue.qsize() == 1  # only the chunk queued before the failure
    assert "request r1: its queue held a object" in caplog.text


async def test_an_unexpected_item_met_moving_onto_a_channel_fails_that_request_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbox = Outbox(window_s=0)
    other = asyncio.create_task(asyncio.sleep(3600))
    outbox.requests["r2"] = other
    outbox.put("r2", GenerateChunk(token_ids=[9]))
    route = _Route("r1", "engine-1")
    for item in (GenerateChunk(token_ids=[1]), "not a chunk", GenerateChunk(token_ids=[2]), _END):
        route.queue.put_nowait(item)
    producer = asyncio.create_task(asyncio.sleep(3600))
    route.move_to(outbox, producer)
    await asyncio.sleep(0)
    assert producer.cancelled()  # so `_ride` reports it unfinished: the engine aborts it
    route.send(GenerateChunk(token_ids=[3]), False)  # dropped: it has ended
    batch = dict((await anext(outbox.sends())).batch)
    assert batch["r1"].token_ids == [1]
    assert (batch["r1"].finish_reason, batch["r1"].error_code) == ("error", "server_error")
    assert batch["r2"].token_ids == [9] and not other.done()  # the other request rides on
    assert "request r1: its queue held a str" in caplog.text
    other.cancel()


# --- what the replica reports to the routers (issue 32) ---------------------------------------


async def test_the_routing_report_holds_the_engines_kv_events_and_its_prefill_queue() -> None:
    """The simulated engine's KV events reach the report through the deployment's own
    subscription; a request waiting for its first token is queued prefill until it has it."""
    engine = SimulatedEngine(
        SimulatedEngineConfig(prefill_tokens_per_s=2000, default_output_tokens=8)
    )
    await engine.start()
    replica = _replica_with(engine, {"ingress-1"})
    prompt = [200006, 1428, 200008, *range(1000, 1600), 200007]
    request = GenerateRequest("r1", prompt, SamplingSettings(8), session_id="conversation-1")
    try:
        reading = asyncio.create_task(_read(replica.generate(request, caller="ingress-1")))
        await asyncio.sleep(0.05)  # 604 tokens at 2,000 tokens/s: still prefilling
        waiting = await replica.record_routing_stats()
        assert waiting[QUEUED_KEY] == len(prompt)  # nothing of it cached yet
        await asyncio.wait_for(reading, timeout=5)
        report = await replica.record_routing_stats()
    finally:
        await engine.shutdown()
    assert report[QUEUED_KEY] == 0 and report[DECODING_KEY] == 0
    assert report[RATE_KEY] == pytest.approx(2000, rel=0.2)
    assert report[KV_EVENTS_KEY] == {"BlockStored": 2}  # the prompt's blocks, then the output's
    assert report[HELD_KEY] == {stable_hash("conversation-1"): 16 * ((len(prompt) + 8) // 16)}


async def test_the_routing_report_names_the_prompt_cache_ttl_each_conversation_asked() -> None:
    """A request's ``cache_ttl_s`` reaches the report, so every router keeps its home that long
    (serve_app.routing.directory)."""
    engine = SimulatedEngine(SimulatedEngineConfig(default_output_tokens=2))
    await engine.start()
    replica = _replica_with(engine, {"ingress-1"})
    prompt = [200006, 1428, 200008, *range(1000, 1100), 200007]
    try:
        for session, ttl_s in (("kept", 12 * 3600), ("default", None)):
            request = GenerateRequest(
                session, prompt, SamplingSettings(2), session_id=session, cache_ttl_s=ttl_s
            )
            await asyncio.wait_for(_read(replica.generate(request, caller="ingress-1")), 5)
        report = await replica.record_routing_stats()
    finally:
        await engine.shutdown()
    assert report[TTL_KEY] == {12 * 3600: [stable_hash("kept")]}


async def test_a_prefix_held_only_in_the_engines_cpu_tier_is_in_the_routing_report() -> None:
    """The engine's CPU-tier events (medium CPU) reach the report through the deployment's
    subscription: the conversation the GPU evicted is reported held on CPU, with the
    engine's load rate."""
    config = SimulatedEngineConfig(
        kv_cache_tokens=16 * 38,  # one conversation: the second evicts the first
        cpu_kv_cache_tokens=16 * 400,
        kv_load_tokens_per_s=250_000,
        prefill_tokens_per_s=50_000,
        default_output_tokens=4,
    )
    engine = SimulatedEngine(config)
    await engine.start()
    replica = _replica_with(engine, {"ingress-1"})
    try:
        for first, session in ((1000, "conversation-1"), (5000, "conversation-2")):
            prompt = [200006, 1428, 200008, *range(first, first + 600), 200007]
            request = GenerateRequest(session, prompt, SamplingSettings(4), session_id=session)
            await asyncio.wait_for(_read(replica.generate(request, caller="ingress-1")), 5)
        report = await replica.record_routing_stats()
    finally:
        await engine.shutdown()
    assert report[HELD_KEY] == {stable_hash("conversation-2"): 16 * 38}
    assert report[CPU_HELD_KEY] == {stable_hash("conversation-1"): 16 * 38}
    assert report[KV_LOAD_RATE_KEY] == 250_000
