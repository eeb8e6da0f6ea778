"""The engine deployment's stream: coalesces what a slow reader has not taken, adds no delay,
and ends with an error chunk keeping the engine error's code (as the in-process client does)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from serve_app.engines.base import EngineError, GenerateChunk
from serve_app.serving.engine_client import InProcessEngineClient
from serve_app.serving.engine_deployment import _END, EngineDeployment

Replica = EngineDeployment.func_or_class  # the plain class behind the Serve deployment


async def test_queued_chunks_go_out_as_one() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    for tokens in ([1], [2, 3], [4]):
        queue.put_nowait(GenerateChunk(token_ids=tokens, num_prompt_tokens=9, num_cached_tokens=4))
    chunk = await Replica._next_coalesced(queue)
    assert chunk.token_ids == [1, 2, 3, 4]
    assert (chunk.num_prompt_tokens, chunk.num_cached_tokens) == (9, 4)


async def test_a_finished_chunk_is_not_merged_past_and_the_end_is_kept() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    queue.put_nowait(GenerateChunk(token_ids=[1]))
    queue.put_nowait(GenerateChunk(token_ids=[2], finish_reason="stop"))
    queue.put_nowait(_END)
    chunk = await Replica._next_coalesced(queue)
    assert chunk.token_ids == [1, 2] and chunk.finish_reason == "stop"
    assert await Replica._next_coalesced(queue) is None


async def test_a_reader_that_keeps_up_gets_each_chunk_without_waiting() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    reader = asyncio.create_task(Replica._next_coalesced(queue))
    await asyncio.sleep(0)
    queue.put_nowait(GenerateChunk(token_ids=[7]))
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
    queue: asyncio.Queue = asyncio.Queue()
    await Replica._produce(replica, None, queue)
    chunks = [queue.get_nowait() for _ in range(3)]
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
    queue: asyncio.Queue = asyncio.Queue()
    await Replica._produce(replica, None, queue)
    assert queue.get_nowait().engine_ttft_s == 0.25  # not the few microseconds it took here


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
        queue: asyncio.Queue = asyncio.Queue()
        await Replica._produce(SimpleNamespace(_engine=_FailingEngine(error)), request, queue)
        on_replica = [queue.get_nowait() for _ in range(2)]
        in_process = [c async for c in InProcessEngineClient(_FailingEngine(error)).stream(request)]
        for chunks in (on_replica, in_process):
            assert [chunk.finish_reason for chunk in chunks] == [None, "error"]
            assert (chunks[-1].error, chunks[-1].error_code) == (message, code)
