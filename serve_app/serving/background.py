"""Background responses: run detached from the HTTP request, events persisted as they happen.

The events go to the response store, so any ingress replica can serve a client that polls,
streams, or resumes with ``starting_after``.

The replica running a response holds a lease on it in the store, renewed every ``renew_s``
(app args ``background:``). A response whose lease lapsed (its replica died, the app was
restarted) is ended as ``failed``, its persisted events closed with ``response.failed`` so
every stream ends, by whichever replica notices first: one serving a client that reads it
(GET, stream, cancel), or the sweep each replica runs at start and every ``lease_s``. The
store ends it with a compare-and-set, so exactly one replica does.

A replica shut down gracefully (a redeploy, a downscale: Serve calls the ingress's ``__del__``)
lets its runs finish first (`BackgroundRunner.stop`): they go on as before, their leases
renewed, so clients following them on any replica see nothing change; new runs are refused
(503, retried elsewhere). What has not finished when the shutdown's grace runs out is ended
``failed``, saying so, before Serve kills the replica. Handing a run to another replica was the
other way (docs/reliability.md says why not).

Cancel works whichever replica takes it: the cancel is a flag in the store that the running
replica watches; a run whose lease lapsed is ended (``cancelled``) by the canceller itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from openai.types.responses import Response, ResponseOutputItemDoneEvent, ResponseStreamEvent
from pydantic import TypeAdapter

from serve_app.config import BackgroundArgs
from serve_app.protocol import sse
from serve_app.protocol.errors import ServerError
from serve_app.protocol.responses import dump_response
from serve_app.protocol.sse import event_json
from serve_app.protocol.stream_events import ResponseEventWriter
from serve_app.serving.turn.persistence import NOT_STORED_MESSAGE, NotStored, stored_or_fail
from serve_app.serving.turn.service import ResponsesService
from serve_app.serving.turn.state import Turn
from serve_app.store.base import ResponseStore, RunEnding

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.05  # events are written in small batches, not one transaction each
POLL_INTERVAL_S = 0.05  # how often a stream reader looks for new events
CANCEL_CHECK_INTERVAL_S = 0.25
# How often a stream reader that finds nothing new checks that the run is still alive.
LIVENESS_CHECK_INTERVAL_S = 1.0
RUNNING = ("queued", "in_progress")
INTERRUPTED_MESSAGE = (
    "The background response was interrupted: the server running it stopped before it "
    "finished. Please try again."
)
INTERRUPTED_CODE = "server_error"
SHUT_DOWN_MESSAGE = (
    "The background response was interrupted: the server running it was shut down (a redeploy "
    "or a scale-down) and the response did not finish within the shutdown's grace period. "
    "Please try again."
)
DRAINING_MESSAGE = "This server is shutting down and starts no background response. Please retry."


@dataclass
class _RunState:
    # Another replica ended the run (its lease had lapsed): write nothing more.
    lost: bool = False


class BackgroundRunner:
    def __init__(
        self,
        service: ResponsesService,
        store: ResponseStore,
        runner_id: str = "local",
        lease: BackgroundArgs | None = None,
    ) -> None:
        self._service = service
        self._store = store
        self._runner_id = runner_id
        self._lease = lease or BackgroundArgs()
        self._tasks: set[asyncio.Task] = set()
        self._runs: dict[str, tuple[asyncio.Task, _RunState]] = {}  # running here, by response
        self._starting = 0  # `start` calls between their check of `_draining` and their run
        self._draining = False

    @property
    def lease(self) -> BackgroundArgs:
        return self._lease

    async def start(self, turn: Turn) -> None:
        """Take the lease, store the response as in progress, then run it on its own task.
        `NotStored` (nothing runs) if either write failed: the client's 200 says it is stored.
        A 503 (retried by clients, elsewhere) once the replica is shutting down."""
        if self._draining:
            raise ServerError(DRAINING_MESSAGE, status_code=503, headers={"Retry-After": "1"})
        self._starting += 1
        try:
            await self._claim(turn)
        finally:
            self._starting -= 1

    async def _claim(self, turn: Turn) -> None:
        response_id = turn.response.id
        # Its 200 is sent before the engine is asked: a refusal then ends it failed, stored.
        turn.announced = True
        try:
            # The lease first: a reader who finds the response finds its run too.
            with stored_or_fail(f"background response {response_id}"):
                await self._store.claim_run(response_id, self._runner_id, self._lease.lease_s)
            await self._service.save(turn)
        except NotStored:
            with contextlib.suppress(Exception):  # else the sweep finds a run with no response
                await self._store.delete(response_id)
            raise
        # A fresh context: Ray Serve links handle calls to the HTTP request whose context they
        # run in, and cancels them when that request ends. A background response must outlive it.
        state = _RunState()
        task = self._spawn(self._run(turn, state), f"background {turn.response.id}")
        self._runs[turn.response.id] = (task, state)
        task.add_done_callback(lambda _: self._runs.pop(turn.response.id, None))

    def start_sweeping(self) -> None:
        """End the runs whose runner is gone, now (a restarted app's) and every lease period."""
        self._spawn(self._sweep_forever(), "background lease sweep")

    async def stop(self, grace_s: float = 0.0) -> None:
        """The replica is shutting down: refuse new runs, give the runs here ``grace_s`` to
        finish (they go on as before: leases renewed, cancels followed, events persisted), then
        end those left ``failed``, saying why, so no client waits a lease out."""
        self._draining = True
        await self._wait_for_runs(grace_s)
        runs = list(self._runs.items())
        for _, (task, state) in runs:
            state.lost = True  # its runner writes nothing more; the ending below closes it
            task.cancel()
        await asyncio.gather(*(task for _, (task, _) in runs), return_exceptions=True)
        for response_id, _ in runs:
            logger.warning("background response %s: unfinished at shutdown, failed", response_id)
            try:
                await self._store.end_run(response_id, _shut_down, only_if_lapsed=False)
            except Exception:  # its lease lapses instead
                logger.exception("background response %s: not ended at shutdown", response_id)
        for task in self._tasks:
            task.cancel()  # the sweep

    async def _wait_for_runs(self, grace_s: float) -> None:
        """Until no run is left here (nor one about to start), or ``grace_s`` has passed."""
        deadline = time.monotonic() + grace_s
        if self._runs or self._starting:
            logger.info(
                "shutting down: waiting up to %.0f s for %d background responses",
                grace_s,
                len(self._runs) + self._starting,
            )
        while (self._runs or self._starting) and (left := deadline - time.monotonic()) > 0:
            tasks = [task for task, _ in self._runs.values()]
            if tasks:
                await asyncio.wait(tasks, timeout=min(left, 1.0))
            else:  # a start between its claim and its task
                await asyncio.sleep(min(left, 0.05))

    def _spawn(self, coroutine, name: str) -> asyncio.Task:
        task = asyncio.create_task(coroutine, name=name, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _run(self, turn: Turn, state: _RunState) -> None:
        response_id = turn.response.id
        generation = asyncio.create_task(self._generate(turn, state))
        tending = asyncio.create_task(self._tend(response_id, generation, state))
        try:
            await generation
        except asyncio.CancelledError:
            if state.lost:
                logger.warning("background response %s: ended elsewhere, stopped", response_id)
                return
            logger.info("background response %s cancelled", response_id)
            prompt_tokens = len(turn.generate.prompt_token_ids)
            ending = turn.translator.finish("abort", prompt_tokens=prompt_tokens, cached_tokens=0)
            try:
                # The final snapshot before the terminal event, as for a finished run.
                await self._service.save(turn)
                await self._persist(response_id, ending)
            except Exception:
                logger.exception("background response %s: cancellation not stored", response_id)
                await self._end(response_id, _unstored)
                return
        except NotStored:
            # Its final snapshot could not be stored: it must not stay `in_progress` (nor end
            # `completed` in its events alone). Its events so far are persisted; the ending
            # adds the failed response and `response.failed` in one transaction.
            await self._end(response_id, _unstored)
            return
        except Exception:
            logger.exception("background response %s failed", response_id)
            # Nobody will continue it: end it now rather than when the lease lapses.
            await self._end(response_id, _interrupted)
            return
        finally:
            tending.cancel()
        try:
            await self._store.finish_run(response_id, self._runner_id)
        except Exception:  # its final snapshot is stored: the lease lapses, the sweep ends it
            logger.exception("background response %s: run not marked ended", response_id)

    async def _end(self, response_id: str, ending: RunEnding) -> None:
        """End the run now, as ``ending`` says; if even that write fails, its lease lapses and
        whichever replica notices first ends it (as interrupted)."""
        try:
            await self._store.end_run(response_id, ending, only_if_lapsed=False)
        except Exception:
            logger.exception("background response %s: not ended; its lease will lapse", response_id)

    async def _generate(self, turn: Turn, state: _RunState) -> None:
        writer = _EventWriter(self._store, turn.response.id)
        try:
            async for event in self._service.events(turn):
                writer.add(event)
        finally:
            await writer.close(flush=not state.lost)

    async def _persist(self, response_id: str, events: list[ResponseStreamEvent]) -> None:
        await self._store.append_events(
            response_id, [(event.sequence_number, event_json(event)) for event in events]
        )

    async def _tend(self, response_id: str, generation: asyncio.Task, state: _RunState) -> None:
        """Renew the lease and watch the cancel flag until the generation ends."""
        period = min(CANCEL_CHECK_INTERVAL_S, self._lease.renew_s)
        renew_at = time.monotonic() + self._lease.renew_s
        while not generation.done():
            await asyncio.sleep(period)
            try:
                if await self._store.cancel_requested(response_id):
                    generation.cancel()
                    return
                if time.monotonic() >= renew_at:
                    renew_at = time.monotonic() + self._lease.renew_s
                    lease_s = self._lease.lease_s
                    if not await self._store.renew_run(response_id, self._runner_id, lease_s):
                        state.lost = True  # ended by another replica, or deleted
                        generation.cancel()
                        return
            except Exception:  # a store hiccup must not kill the response: the lease has room
                logger.warning("background response %s: lease not renewed", response_id)

    async def end_if_lapsed(self, response_id: str, *, cancelled: bool = False) -> bool:
        """End the run if its lease lapsed (``failed``, or ``cancelled`` for a canceller).
        True if this call ended it. Reads first: a live run costs no write."""
        run = await self._store.get_run(response_id)
        if run is not None and (run.ended or run.lease_expires_at > time.time()):
            return False
        ending = _cancelled if cancelled else _interrupted
        try:
            ended = await self._store.end_run(response_id, ending)
        except Exception:
            logger.exception("background response %s: could not be ended", response_id)
            return False
        if ended:
            logger.warning(
                "background response %s: its runner %s is gone; ended as %s",
                response_id,
                run.runner if run else "(none recorded)",
                "cancelled" if cancelled else "failed",
            )
        return ended

    async def sweep(self) -> int:
        """End every run whose lease lapsed; how many this replica ended."""
        ended = 0
        for response_id in await self._store.lapsed_runs():
            ended += await self.end_if_lapsed(response_id)
        return ended

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:
                logger.exception("background lease sweep failed")
            await asyncio.sleep(self._lease.lease_s)

    async def stream(self, response_id: str, after: int = -1) -> AsyncIterator[bytes]:
        """SSE of the persisted events after ``after``, following the run to its end."""
        checked_at = float("-inf")
        run_over = False
        while True:
            events = await self._store.events_after(response_id, after)
            for number, data in events:
                yield sse.frame(_event_type(data), data)
                after = number
                if _event_type(data) in sse.TERMINAL_EVENT_TYPES:
                    return
            if events:
                continue
            if run_over:
                return  # over, and every event it left is sent
            if time.monotonic() - checked_at >= LIVENESS_CHECK_INTERVAL_S:
                checked_at = time.monotonic()
                run_over = await self._run_over(response_id)
                if run_over:
                    continue  # read once more: an ending writes its events as it ends
            await asyncio.sleep(POLL_INTERVAL_S)

    async def _run_over(self, response_id: str) -> bool:
        """Whether the run has ended (ending it here if its lease lapsed) or was deleted."""
        await self.end_if_lapsed(response_id)
        run = await self._store.get_run(response_id)
        if run is None:
            return await self._store.get(response_id) is None  # deleted while streaming
        return run.ended


class _EventWriter:
    """Persists a run's events in small batches, each written at most ``FLUSH_INTERVAL_S``
    after its first event whether or not more follow: a turn paused in the engine must not
    hold back the events before the pause from the clients following it."""

    def __init__(self, store: ResponseStore, response_id: str) -> None:
        self._store = store
        self._response_id = response_id
        self._pending: list[tuple[int, str]] = []
        self._ready = asyncio.Event()
        self._closed = False
        self._task = asyncio.create_task(self._write_loop())

    def add(self, event: ResponseStreamEvent) -> None:
        self._pending.append((event.sequence_number, event_json(event)))
        self._ready.set()

    async def close(self, flush: bool = True) -> None:
        """Write what is pending (unless ``flush`` is false) and stop."""
        if not flush:
            self._pending.clear()
        self._closed = True
        self._ready.set()
        await asyncio.shield(self._task)
        if self._pending:  # the last write failed: try once more, and let it raise
            await self._write()

    async def _write_loop(self) -> None:
        while not self._closed:
            await self._ready.wait()
            if not self._closed:
                await asyncio.sleep(FLUSH_INTERVAL_S)  # gather a batch
            try:
                await self._write()
            except Exception:  # kept, and written with the next batch
                logger.warning("response %s: events not persisted yet", self._response_id)

    async def _write(self) -> None:
        self._ready.clear()
        batch, self._pending = self._pending, []
        try:
            await self._store.append_events(self._response_id, batch)
        except BaseException:
            self._pending[:0] = batch
            raise


def _ending(end: Callable[[ResponseEventWriter, Response], None]) -> RunEnding:
    """A `RunEnding`: the response with the items its runner finished, and its terminal event,
    written by a `ResponseEventWriter` resumed after the stored events (``end`` ends it)."""

    def build(
        response: dict[str, Any], done_events: list[str], last: int
    ) -> tuple[dict[str, Any], list[tuple[int, str]]]:
        finished = sorted(
            (_OUTPUT_ITEM_DONE.validate_json(data) for data in done_events),
            key=lambda event: event.output_index,
        )
        # As stored, not judged again: the runner's own snapshot of it.
        stored = Response.model_construct(**response)
        writer = ResponseEventWriter.resumed(stored, [e.item for e in finished], last + 1)
        end(writer, stored)
        (event,) = writer.take_events()
        return dump_response(writer.response), [(event.sequence_number, event_json(event))]

    return build


_OUTPUT_ITEM_DONE = TypeAdapter(ResponseOutputItemDoneEvent)

_interrupted = _ending(lambda writer, _: writer.fail(INTERRUPTED_CODE, INTERRUPTED_MESSAGE))
# A run its replica, shutting down, could not let finish in time.
_shut_down = _ending(lambda writer, _: writer.fail(INTERRUPTED_CODE, SHUT_DOWN_MESSAGE))
# A run whose final snapshot could not be stored.
_unstored = _ending(lambda writer, _: writer.fail("server_error", NOT_STORED_MESSAGE))
# As the running replica ends a cancelled response (see ResponseStreamTranslator.finish),
# with the usage stored so far.
_cancelled = _ending(lambda writer, stored: writer.finish("cancelled", stored.usage))


def _event_type(data: str) -> str:
    # event_json puts "type" first: no need to parse the whole event.
    return data[len('{"type":"') : data.index('"', len('{"type":"'))]
