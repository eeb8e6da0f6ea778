"""The engine deployment: one engine per replica, token ids in, token ids out."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from serve_app.config import EngineConfig
from serve_app.engines.base import GenerateChunk, GenerateRequest, error_chunk
from serve_app.engines.factory import make_engine
from serve_app.routing.directory import ServedConversations

_END = object()


@serve.deployment(name="EngineDeployment", max_ongoing_requests=64)
class EngineDeployment:
    async def __init__(self, engine: EngineConfig) -> None:
        self._engine = make_engine(engine)
        # Same id the request router puts on its ring: lets the ingress attribute cache hits.
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        self._served = ServedConversations(self._replica_id)
        await self._engine.start()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream the engine's chunks, coalescing those the reader has not taken yet.

        Each chunk through a handle costs real time (~1k chunks/s per stream). The engine runs
        ahead into a queue; every yield sends all that is queued as one chunk, so a slow reader
        gets fewer, larger chunks and a fast one gets every token as soon as it exists.
        """
        if request.session_id:
            self._served.record(request.session_id)
        queue: asyncio.Queue[object] = asyncio.Queue()
        producer = asyncio.create_task(self._produce(request, queue))
        finished = False
        first = True
        try:
            while not finished:
                chunk = await self._next_coalesced(queue)
                if chunk is None:
                    break
                if first:
                    chunk.replica, first = self._replica_id, False
                finished = chunk.finish_reason is not None
                yield chunk
        finally:
            if not producer.done():
                # Cancelled by the caller (client disconnect): stop generating and free KV.
                producer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await producer
                await self._engine.abort(request.request_id)

    async def _produce(self, request: GenerateRequest, queue: asyncio.Queue[object]) -> None:
        arrived = time.monotonic()
        first_token = True
        try:
            async for chunk in self._engine.generate(request):
                if first_token and chunk.token_ids:
                    if chunk.engine_ttft_s is None:  # the engine did not model it
                        chunk.engine_ttft_s = time.monotonic() - arrived
                    first_token = False
                queue.put_nowait(chunk)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            queue.put_nowait(error_chunk(request.request_id, exc))
        finally:
            queue.put_nowait(_END)

    @staticmethod
    async def _next_coalesced(queue: asyncio.Queue[object]) -> GenerateChunk | None:
        item = await queue.get()
        if item is _END:
            return None
        assert isinstance(item, GenerateChunk)
        chunk = item
        while not queue.empty() and chunk.finish_reason is None:
            following = queue.get_nowait()
            if following is _END:
                queue.put_nowait(_END)
                break
            assert isinstance(following, GenerateChunk)
            chunk = chunk.merge(following)
        return chunk

    def replica_id(self) -> str:
        return self._replica_id

    def num_ongoing_requests(self) -> int:
        return self._engine.num_ongoing_requests()

    async def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve hands this to every request router (see ``serve_app.routing.directory``).
        Async, so it runs on the event loop that records conversations, not in a thread."""
        return self._served.report()

    async def check_health(self) -> None:
        await self._engine.check_health()

    async def __del__(self) -> None:
        await self._engine.shutdown()
