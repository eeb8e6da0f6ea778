"""Background responses: run detached from the HTTP request, events persisted as they happen.

The events go to the response store, so any ingress replica can serve a client that polls,
streams, or resumes with ``starting_after``, and cancel works whichever replica runs it: the
cancel request is a flag in the store that the running replica watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator

from serve_app.protocol.sse import event_json
from serve_app.serving.responses_service import ResponsesService, Turn
from serve_app.store.base import ResponseStore

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.05  # events are written in small batches, not one transaction each
POLL_INTERVAL_S = 0.05  # how often a stream reader looks for new events
CANCEL_CHECK_INTERVAL_S = 0.25
TERMINAL_TYPES = ("response.completed", "response.incomplete", "response.failed")


class BackgroundRunner:
    def __init__(self, service: ResponsesService, store: ResponseStore) -> None:
        self._service = service
        self._store = store
        self._tasks: set[asyncio.Task] = set()

    async def start(self, turn: Turn) -> None:
        """Store the response as in progress, then run it on its own task."""
        await self._service.save(turn)
        # A fresh context: Ray Serve links handle calls to the HTTP request whose context they
        # run in, and cancels them when that request ends. A background response must outlive it.
        task = asyncio.create_task(
            self._run(turn), name=f"background {turn.response.id}", context=contextvars.Context()
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, turn: Turn) -> None:
        response_id = turn.response.id
        generation = asyncio.create_task(self._generate(turn))
        watcher = asyncio.create_task(self._watch_cancel(response_id, generation))
        try:
            await generation
        except asyncio.CancelledError:
            logger.info("background response %s cancelled", response_id)
            prompt_tokens = len(turn.generate.prompt_token_ids)
            ending = turn.translator.finish("abort", prompt_tokens=prompt_tokens, cached_tokens=0)
            await self._persist(response_id, ending)
            await self._service.save(turn)
        except Exception:
            logger.exception("background response %s failed", response_id)
        finally:
            watcher.cancel()

    async def _generate(self, turn: Turn) -> None:
        pending: list[tuple[int, str]] = []
        flushed_at = time.monotonic()
        async for event in self._service.events(turn):
            pending.append((event.sequence_number, event_json(event)))
            if event.type in TERMINAL_TYPES or time.monotonic() - flushed_at > FLUSH_INTERVAL_S:
                await self._store.append_events(turn.response.id, pending)
                pending, flushed_at = [], time.monotonic()
        await self._store.append_events(turn.response.id, pending)

    async def _persist(self, response_id: str, events) -> None:
        await self._store.append_events(
            response_id, [(event.sequence_number, event_json(event)) for event in events]
        )

    async def _watch_cancel(self, response_id: str, generation: asyncio.Task) -> None:
        while not generation.done():
            await asyncio.sleep(CANCEL_CHECK_INTERVAL_S)
            with contextlib.suppress(Exception):  # a store hiccup must not kill the response
                if await self._store.cancel_requested(response_id):
                    generation.cancel()
                    return

    async def stream(self, response_id: str, after: int = -1) -> AsyncIterator[bytes]:
        """SSE of the persisted events after ``after``, following them until the last one."""
        while True:
            events = await self._store.events_after(response_id, after)
            for number, data in events:
                yield f"event: {_event_type(data)}\ndata: {data}\n\n".encode()
                after = number
                if _event_type(data) in TERMINAL_TYPES:
                    return
            if not events:
                if await self._store.get(response_id) is None:
                    return  # deleted while streaming
                await asyncio.sleep(POLL_INTERVAL_S)


def _event_type(data: str) -> str:
    # event_json puts "type" first: no need to parse the whole event.
    return data[len('{"type":"') : data.index('"', len('{"type":"'))]
