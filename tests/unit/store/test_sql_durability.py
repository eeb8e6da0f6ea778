"""``store: true`` is a promise: a response, a conversation append, a background run's snapshot
is acknowledged only once it is committed.

The store's writes are made to fail the way contention makes them fail (SQLite's "database is
locked", PostgreSQL's serialization failure), below the store's own retries: a few times (the
client gets its answer, and the response is there), or always (the client is told: a 500
``server_error`` in OpenAI's shape, or ``response.failed`` on a stream, and nothing is stored).
Driven through the openai SDK, httpx and a real WebSocket against the app in this process, on
SQLite and on the session's PostgreSQL. Then many writers in two processes on one SQLite file,
each process's event loop kept busy as a serving ingress's is: none lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import queue
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from sqlalchemy import event
from websockets.asyncio.client import connect

from serve_app.config import AppArgs
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.ingress import create_api
from serve_app.store.base import StoredResponse
from serve_app.store.sql import WRITE_ATTEMPTS, SqlResponseStore
from tests.support import MODEL
from tests.support.helpers import on_uvicorn, sdk_client
from tests.unit.store.test_sql import postgres_url, store_url  # noqa: F401 - fixtures

WRITES = re.compile(r"\s*(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


class WriteFaults:
    """Makes the store's write statements fail as contention does, ``times`` times (or
    always), where ``matching`` matches the statement: raised by the driver, under SQLAlchemy,
    so the store sees exactly what a locked SQLite file or a PostgreSQL serialization failure
    gives it."""

    def __init__(self, store: SqlResponseStore) -> None:
        self._engine = store._engine.sync_engine
        self.left = 0.0
        self.raised = 0
        self._matching = WRITES
        event.listen(self._engine, "before_cursor_execute", self._maybe_fail)

    def fail(self, times: float = float("inf"), matching: str | None = None) -> None:
        self.left = times
        self._matching = re.compile(matching, re.IGNORECASE) if matching else WRITES

    def stop(self) -> None:
        self.left = 0

    def _maybe_fail(self, connection, _cursor, statement: str, *_: Any) -> None:
        if self.left <= 0 or not self._matching.match(statement):
            return
        self.left -= 1
        self.raised += 1
        raise contention(connection.dialect)


def contention(dialect) -> Exception:
    """The driver's error for a write that lost to another: SQLite busy, PostgreSQL 40001."""
    if dialect.name == "sqlite":
        error = sqlite3.OperationalError("database is locked")
        error.sqlite_errorcode = sqlite3.SQLITE_BUSY  # as the sqlite3 module sets it
        error.sqlite_errorname = "SQLITE_BUSY"
        return error
    import asyncpg

    cause = asyncpg.exceptions.SerializationError("could not serialize access")
    return dialect.loaded_dbapi.Error(str(cause), cause)


@dataclass
class App:
    api: FastAPI
    store: SqlResponseStore
    faults: WriteFaults


@pytest.fixture
async def app(store_url: str) -> AsyncIterator[App]:  # noqa: F811 - the imported fixture
    store = SqlResponseStore(store_url)
    await store.start()
    for response_id in await store.ids():  # the PostgreSQL server is shared by the session
        await store.delete(response_id)
    engine = SimulatedEngine(SimulatedEngineConfig(decode_tokens_per_s=50_000))
    await engine.start()
    api = create_api(AppArgs(), InProcessEngineClient(engine), ReasoningVault("k"), store)
    try:
        yield App(api, store, WriteFaults(store))
    finally:
        await engine.shutdown()
        await store.close()


@pytest.fixture
async def http(app: App) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app.api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        yield client


def assert_server_error(answer: httpx.Response) -> None:
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error" and error["code"] == "server_error"
    assert "could not be stored" in error["message"]


async def test_a_write_that_meets_contention_is_retried_then_acknowledged(app: App) -> None:
    client = sdk_client(app.api)
    app.faults.fail(times=WRITE_ATTEMPTS - 1)  # the last try goes through
    created = await client.responses.create(model=MODEL, input="hello", store=True)
    assert created.status == "completed"
    assert app.faults.raised == WRITE_ATTEMPTS - 1
    assert (await client.responses.retrieve(created.id)).output_text == created.output_text
    # Streamed too: the terminal event comes after the commit.
    app.faults.fail(times=2)
    async with await client.responses.create(
        model=MODEL, input="again", previous_response_id=created.id, stream=True
    ) as stream:
        events = [event async for event in stream]
    assert events[-1].type == "response.completed"
    stored = await client.responses.retrieve(events[-1].response.id)
    assert stored.previous_response_id == created.id


async def test_a_response_that_cannot_be_stored_is_a_500_not_a_200(
    app: App, http: httpx.AsyncClient
) -> None:
    client = sdk_client(app.api)
    app.faults.fail()
    with pytest.raises(openai.InternalServerError) as failed:
        await client.responses.create(model=MODEL, input="hello", store=True)
    assert failed.value.status_code == 500
    assert failed.value.body["type"] == "server_error"
    assert failed.value.body["code"] == "server_error"
    answer = await http.post("/v1/responses", json={"model": MODEL, "input": "x"})
    assert_server_error(answer)
    # Nothing half-stored: no response to retrieve or continue.
    app.faults.stop()
    assert await app.store.ids() == []
    # `store: false` asks for no write: unaffected.
    app.faults.fail()
    unstored = await client.responses.create(model=MODEL, input="hello", store=False)
    assert unstored.status == "completed"


async def test_a_stream_whose_response_cannot_be_stored_ends_failed(app: App) -> None:
    client = sdk_client(app.api)
    app.faults.fail()
    async with await client.responses.create(
        model=MODEL, input="hello", store=True, stream=True
    ) as stream:
        events = [event async for event in stream]
    types = [event.type for event in events]
    assert types[-1] == "response.failed", types
    assert "response.completed" not in types
    final = events[-1].response
    assert final.status == "failed"
    assert final.error.code == "server_error"
    assert "could not be stored" in final.error.message
    assert [event.sequence_number for event in events] == list(range(len(events)))
    app.faults.stop()
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(final.id)


@contextlib.asynccontextmanager
async def served(api: FastAPI) -> AsyncIterator[str]:
    """The app on uvicorn on a free port (a real WebSocket); its ws:// URL."""
    async with on_uvicorn(api) as url:
        yield url.replace("http://", "ws://", 1) + "/v1/responses"


async def ws_turn(socket, **body: Any) -> list[dict[str, Any]]:
    await socket.send(json.dumps({"type": "response.create", "model": MODEL, **body}))
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in TERMINAL:
        events.append(json.loads(await asyncio.wait_for(socket.recv(), 30)))
    return events


TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


async def test_a_websocket_turn_that_cannot_be_stored_ends_failed(app: App) -> None:
    async with served(app.api) as url, connect(url) as socket:
        app.faults.fail()
        events = await ws_turn(socket, input="hello", store=True)
        assert events[-1]["type"] == "response.failed", [e["type"] for e in events]
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
        # A prewarm (no generation) is stored before it is answered completed, too.
        prewarm = await ws_turn(socket, input="warm", store=True, generate=False)
        assert prewarm[-1]["type"] == "response.failed"
        # Nothing is stored, and the connection does not remember them either.
        app.faults.stop()
        assert await app.store.ids() == []
        continued = await ws_turn(socket, input="more", previous_response_id=failed["id"])
        assert continued[-1]["type"] == "error" and continued[-1]["status"] == 404
        # `store: false` is unaffected.
        app.faults.fail()
        unstored = await ws_turn(socket, input="hello", store=False)
        assert unstored[-1]["type"] == "response.completed"


async def test_a_conversation_append_that_cannot_be_stored_is_a_500(
    app: App, http: httpx.AsyncClient
) -> None:
    item = {"type": "message", "role": "user", "content": "first"}
    created = await http.post("/v1/conversations", json={"items": [item]})
    conversation = created.json()["id"]
    app.faults.fail()
    more = {"type": "message", "role": "user", "content": "more"}
    assert_server_error(
        await http.post(f"/v1/conversations/{conversation}/items", json={"items": [more]})
    )
    assert_server_error(await http.post("/v1/conversations", json={"items": [item]}))
    # A response extending the conversation: not acknowledged, not stored, nothing appended.
    body = {"model": MODEL, "input": "hi", "conversation": conversation}
    assert_server_error(await http.post("/v1/responses", json=body))
    app.faults.stop()
    listed = (await http.get(f"/v1/conversations/{conversation}/items")).json()["data"]
    assert [entry["content"][0]["text"] for entry in listed] == ["first"]
    assert await app.store.ids() == []


async def test_a_turn_and_its_conversation_items_are_stored_together_or_not_at_all(
    app: App, http: httpx.AsyncClient
) -> None:
    conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    # Only the conversation's items fail: the response must not be stored without them.
    app.faults.fail(matching=r"\s*INSERT INTO conversation_items")
    body = {"model": MODEL, "input": "hi", "conversation": conversation}
    assert_server_error(await http.post("/v1/responses", json=body))
    app.faults.stop()
    assert await app.store.ids() == []
    assert (await http.get(f"/v1/conversations/{conversation}/items")).json()["data"] == []
    # With the store back, the same turn is stored whole.
    answer = await http.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    listed = (await http.get(f"/v1/conversations/{conversation}/items?order=asc")).json()["data"]
    assert listed[0]["type"] == "message" and len(listed) >= 2
    assert await app.store.ids() == [answer.json()["id"]]


async def test_a_background_response_is_acknowledged_only_once_stored(
    app: App, http: httpx.AsyncClient
) -> None:
    body = {"model": MODEL, "input": "hello", "background": True}
    app.faults.fail()
    assert_server_error(await http.post("/v1/responses", json=body))
    app.faults.stop()
    assert await app.store.ids() == []
    assert await app.store.lapsed_runs() == []  # no run left behind for the sweep
    # Its final snapshot fails (a snapshot replaces its items: that DELETE fails): it must not
    # stay in progress, nor end completed in its events alone.
    app.faults.fail(matching=r"\s*DELETE FROM items")
    created = await http.post("/v1/responses", json=body)
    assert created.status_code == 200, created.text
    response_id = created.json()["id"]
    deadline = time.monotonic() + 30
    while (stored := await app.store.get(response_id)).response["status"] in (
        "queued",
        "in_progress",
    ):
        assert time.monotonic() < deadline, "the run never ended"
        await asyncio.sleep(0.05)
    app.faults.stop()
    assert stored.response["status"] == "failed"
    assert stored.response["error"]["code"] == "server_error"
    events = [json.loads(data) for _, data in await app.store.events_after(response_id, -1)]
    terminal = [e["type"] for e in events if e["type"].startswith("response.") and "response" in e]
    assert terminal[-1] == "response.failed" and "response.completed" not in terminal
    assert (await app.store.get_run(response_id)).ended


# --- many writers, two processes, one SQLite file -------------------------------------------

WRITERS_PER_PROCESS = 32
PAUSE_S = 0.0005
RESPONSES_PER_PROCESS = 96


def _stored(response_id: str) -> StoredResponse:
    body = {"id": response_id, "status": "completed", "created_at": 1, "output": []}
    items = [{"id": f"in_{response_id}", "type": "message", "role": "user", "content": "x" * 2000}]
    return StoredResponse(response_id, None, body, items)


async def _busy_loop() -> None:
    """An ingress's event loop streaming tokens: always some CPU work ready to run, so each
    round trip of a transaction waits its turn in the loop."""
    while True:
        started = time.perf_counter()
        while time.perf_counter() - started < 0.002:
            pass
        await asyncio.sleep(PAUSE_S)


async def _write_many(url: str, tag: str) -> tuple[list[str], list[str]]:
    """Every response written by ``WRITERS_PER_PROCESS`` concurrent writers: (acknowledged
    ids, failed ids)."""
    store = SqlResponseStore(url)
    await store.start()
    busy = asyncio.create_task(_busy_loop())
    turns = asyncio.Semaphore(WRITERS_PER_PROCESS)
    acknowledged: list[str] = []
    failed: list[str] = []

    async def write(index: int) -> None:
        response_id = f"resp_{tag}_{index}"
        async with turns:
            try:
                await store.put(_stored(response_id))
            except Exception:
                failed.append(response_id)
            else:
                acknowledged.append(response_id)

    try:
        await asyncio.gather(*(write(index) for index in range(RESPONSES_PER_PROCESS)))
    finally:
        busy.cancel()
        await store.close()
    return acknowledged, failed


def _writer_process(url: str, tag: str, results) -> None:
    try:
        results.put((tag, *asyncio.run(_write_many(url, tag))))
    except BaseException as error:  # the store did not even start: say so, do not hang
        results.put((tag, [], [repr(error)]))
        raise


def _outcome(results, processes: list) -> tuple[str, list[str], list[str]]:
    """The next writer's outcome; a writer that died without one fails the test at once."""
    while True:
        with contextlib.suppress(queue.Empty):
            return results.get(timeout=1)
        if any(process.exitcode not in (None, 0) for process in processes):
            with contextlib.suppress(queue.Empty):
                return results.get(timeout=5)
            raise AssertionError(f"a writer died: {[p.exitcode for p in processes]}")


async def test_many_writers_in_two_processes_on_one_sqlite_file_lose_nothing(
    tmp_path: Path,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}"
    first = SqlResponseStore(url)
    await first.start()  # the schema, so both writers start on the same footing
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(target=_writer_process, args=(url, tag, results)) for tag in ("a", "b")
    ]
    for process in processes:
        process.start()
    outcomes = [await asyncio.to_thread(_outcome, results, processes) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    acknowledged = [response_id for _, done, _ in outcomes for response_id in done]
    failed = [response_id for _, _, lost in outcomes for response_id in lost]
    stored = set(await first.ids())
    await first.close()
    # None acknowledged without being stored, and none lost (every write committed).
    assert not [response_id for response_id in acknowledged if response_id not in stored]
    assert not failed, f"{len(failed)} of {2 * RESPONSES_PER_PROCESS} writes failed"
    assert len(stored) == 2 * RESPONSES_PER_PROCESS
