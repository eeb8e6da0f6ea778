"""The engine deployment's stream: coalesces what a slow reader has not taken, adds no delay."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from serve_app.engines.base import GenerateChunk
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
