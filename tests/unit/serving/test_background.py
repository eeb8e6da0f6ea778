"""Background responses hold a lease: a response whose runner is gone is ended ``failed``
(once, by a compare-and-set in the store) when a client reads it or a replica sweeps, and a
client attaching to a running one gets what was persisted at once, then the live events.

The store tests run on SQLite and PostgreSQL; the app tests run the ingress's FastAPI app in
this process (no Ray), where a replica that died is a run recorded in the store with no task
renewing its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from serve_app.config import AppArgs, BackgroundArgs
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.serving.background import (
    INTERRUPTED_CODE,
    SHUT_DOWN_MESSAGE,
    BackgroundRunner,
)
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.ingress import create_api
from serve_app.store.base import StoredResponse
from serve_app.store.sql import SqlResponseStore
from tests.support import MODEL
from tests.support.helpers import sdk_client
from tests.unit.store.test_sql import (  # noqa: F401 - postgres_url: the fixture, for store_url
    postgres_url,
    store_url,
)

PAUSE_S = 2.0
SCRIPT = {
    "turns": [
        {
            "match": "PAUSE",
            "items": [
                {"reasoning": "Thinking before the pause."},
                {"sleep": PAUSE_S},
                {"text": "After the pause."},
            ],
        },
        {"match": "QUICK", "items": [{"reasoning": "Short."}, {"text": "Done."}]},
        {
            "match": "FOREVER",
            "items": [{"reasoning": "This will take a while."}, {"sleep": 60}, {"text": "Late."}],
        },
    ]
}
SHORT_LEASE = BackgroundArgs(lease_s=0.5, renew_s=0.1)
REASONING_DONE = {
    "type": "response.output_item.done",
    "item": {"type": "reasoning", "id": "rs_1", "summary": [], "content": []},
    "output_index": 0,
    "sequence_number": 2,
}


def background_response(response_id: str, status: str = "in_progress") -> StoredResponse:
    body = {
        "id": response_id,
        "object": "response",
        "status": status,
        "background": True,
        "created_at": 1,
        "output": [],
        "error": None,
    }
    return StoredResponse(response_id, None, body, [])


def event(data: dict[str, Any]) -> tuple[int, str]:
    return data["sequence_number"], json.dumps(data, separators=(",", ":"))


async def runner_gone(store: SqlResponseStore, response_id: str) -> None:
    """A background response whose replica died: its events so far, a lapsed lease."""
    await store.claim_run(response_id, "dead-replica", lease_s=-1)
    await store.put(background_response(response_id))
    await store.append_events(
        response_id,
        [
            event({"type": "response.created", "sequence_number": 0, "response": {}}),
            event({"type": "response.in_progress", "sequence_number": 1, "response": {}}),
            event(REASONING_DONE),
        ],
    )


def ending(response: dict, done: list[str], last: int) -> tuple[dict, list[tuple[int, str]]]:
    output = [json.loads(data)["item"] for data in done]
    final = {**response, "status": "failed", "output": output}
    return final, [event({"type": "response.failed", "sequence_number": last + 1})]


# --- the store: lease, compare-and-set, sweep ---------------------------------------------


@pytest.fixture
async def runs(store_url: str) -> AsyncIterator[SqlResponseStore]:  # noqa: F811 - the fixture
    """A store on SQLite or on the session's PostgreSQL (emptied: the server is shared)."""
    store = SqlResponseStore(store_url)
    await store.start()
    for response_id in await store.ids():
        await store.delete(response_id)
    yield store
    await store.close()


async def test_a_lapsed_run_is_ended_by_exactly_one_of_many(runs: SqlResponseStore) -> None:
    await runner_gone(runs, "resp_lapsed")
    assert await runs.lapsed_runs() == ["resp_lapsed"]
    results = await asyncio.gather(*(runs.end_run("resp_lapsed", ending) for _ in range(10)))
    assert results.count(True) == 1
    stored = await runs.get("resp_lapsed")
    assert stored.response["status"] == "failed"
    assert stored.output_items == [REASONING_DONE["item"]]
    numbers = [number for number, _ in await runs.events_after("resp_lapsed", -1)]
    assert numbers == [0, 1, 2, 3]  # closed by one terminal event after the last
    assert await runs.lapsed_runs() == []
    # The runner, were it alive after all, may not continue a run ended for it.
    assert not await runs.renew_run("resp_lapsed", "dead-replica", lease_s=10)


async def test_a_live_run_is_ended_only_when_forced(runs: SqlResponseStore) -> None:
    await runs.claim_run("resp_live", "replica-a", lease_s=30)
    await runs.put(background_response("resp_live"))
    assert await runs.renew_run("resp_live", "replica-a", lease_s=30)
    assert not await runs.renew_run("resp_live", "replica-b", lease_s=30)  # not its run
    assert await runs.lapsed_runs() == []
    assert not await runs.end_run("resp_live", ending)
    assert (await runs.get("resp_live")).response["status"] == "in_progress"
    assert await runs.end_run("resp_live", ending, only_if_lapsed=False)
    assert (await runs.get("resp_live")).response["status"] == "failed"


async def test_a_run_its_runner_finished_is_left_alone(runs: SqlResponseStore) -> None:
    await runs.claim_run("resp_done", "replica-a", lease_s=-1)
    await runs.put(background_response("resp_done", status="completed"))
    # Its runner stored the final response, then died before marking the run ended.
    assert not await runs.end_run("resp_done", ending)
    assert (await runs.get("resp_done")).response["status"] == "completed"
    assert await runs.lapsed_runs() == []  # and it is not looked at again


async def test_a_response_stored_before_leases_counts_as_lapsed(runs: SqlResponseStore) -> None:
    await runs.put(background_response("resp_old"))  # no run recorded
    results = await asyncio.gather(*(runs.end_run("resp_old", ending) for _ in range(5)))
    assert results.count(True) == 1
    assert (await runs.get("resp_old")).response["status"] == "failed"
    assert not await runs.end_run("resp_missing", ending)


async def test_deleting_a_response_deletes_its_run(runs: SqlResponseStore) -> None:
    await runner_gone(runs, "resp_gone")
    await runs.delete("resp_gone")
    assert await runs.get_run("resp_gone") is None
    assert await runs.lapsed_runs() == []


# --- the app, in process ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def app(
    db: Path, lease: BackgroundArgs = SHORT_LEASE, replica_id: str = "replica-a"
) -> AsyncIterator[tuple[FastAPI, SqlResponseStore, SimulatedEngine]]:
    """An ingress app (as one replica serves it) on the scripted engine and a SQLite store."""
    store = SqlResponseStore(f"sqlite+aiosqlite:///{db}")
    await store.start()
    engine = SimulatedEngine(SimulatedEngineConfig(script=SCRIPT, decode_tokens_per_s=50_000))
    await engine.start()
    args = AppArgs(background=lease)
    api = create_api(args, InProcessEngineClient(engine), ReasoningVault("k"), store, replica_id)
    try:
        yield api, store, engine
    finally:
        await engine.shutdown()
        await store.close()


def runner(api: FastAPI) -> BackgroundRunner:
    return api.state.background


async def timed_events(
    chunks: AsyncIterator[bytes], started: float, timeout_s: float = 15
) -> list[tuple[float, dict]]:
    """A stream's events, each with when it came (seconds after ``started``); a stream that
    does not end within ``timeout_s`` fails the test rather than hang it."""
    seen = []
    async with asyncio.timeout(timeout_s):
        async for chunk in chunks:
            data = chunk.decode().split("data: ", 1)[1]
            seen.append((time.monotonic() - started, json.loads(data)))
    return seen


async def test_attaching_mid_run_gets_the_persisted_events_at_once_then_live_ones(
    tmp_path: Path,
) -> None:
    async with app(tmp_path / "attach.db") as (api, _, _):
        created = await sdk_client(api).responses.create(
            model=MODEL, input="PAUSE", background=True
        )
        await asyncio.sleep(0.5)  # the reasoning is done; the engine pauses for PAUSE_S
        started = time.monotonic()
        seen = await timed_events(runner(api).stream(created.id), started)
    types = [data["type"] for _, data in seen]
    assert [data["sequence_number"] for _, data in seen] == list(range(len(seen)))
    assert types[-1] == "response.completed"
    reasoning_done = types.index("response.output_item.done")
    # Everything before the pause, at once (not when the next event after it comes).
    assert seen[reasoning_done][0] < 0.5, seen[: reasoning_done + 1]
    # Then the live events, as the run makes them.
    text_added = types.index("response.output_item.added", reasoning_done)
    assert seen[text_added][0] > PAUSE_S - 0.5 - 0.3


async def test_a_live_run_renews_its_lease_and_readers_leave_it(tmp_path: Path) -> None:
    async with app(tmp_path / "live.db") as (api, store, engine):
        client = sdk_client(api)
        created = await client.responses.create(model=MODEL, input="FOREVER", background=True)
        await asyncio.sleep(3 * SHORT_LEASE.lease_s)
        assert await runner(api).sweep() == 0
        assert (await client.responses.retrieve(created.id)).status == "in_progress"
        run = await store.get_run(created.id)
        assert run.runner == "replica-a" and run.lease_expires_at > time.time()
        assert (await client.responses.cancel(created.id)).status == "cancelled"
        assert engine.num_ongoing_requests() == 0


async def test_a_response_whose_runner_died_ends_failed_when_read(tmp_path: Path) -> None:
    async with app(tmp_path / "read.db", replica_id="replica-b") as (api, store, _):
        client = sdk_client(api)
        await runner_gone(store, "resp_read")
        fetched = await client.responses.retrieve("resp_read")
        assert fetched.status == "failed"
        assert fetched.error.code == INTERRUPTED_CODE and "interrupted" in fetched.error.message
        assert [item.type for item in fetched.output] == ["reasoning"]
        # A stream attached to it replays the events and ends with response.failed.
        streamed = [data for _, data in await timed_events(runner(api).stream("resp_read"), 0)]
        assert [data["sequence_number"] for data in streamed] == [0, 1, 2, 3]
        assert streamed[-1]["type"] == "response.failed"
        assert streamed[-1]["response"]["error"]["code"] == INTERRUPTED_CODE
        # It is over: there is nothing to cancel.
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            cancel = await http.post("/v1/responses/resp_read/cancel")
        assert cancel.status_code == 400 and "failed" in cancel.json()["error"]["message"]


async def test_a_stream_attached_before_the_lease_lapses_ends_when_it_does(
    tmp_path: Path,
) -> None:
    async with app(tmp_path / "follow.db") as (api, store, _):
        await runner_gone(store, "resp_follow")
        await store.renew_run("resp_follow", "dead-replica", SHORT_LEASE.lease_s)
        started = time.monotonic()
        streamed = await timed_events(runner(api).stream("resp_follow"), started)
    assert streamed[-1][1]["type"] == "response.failed"
    assert SHORT_LEASE.lease_s - 0.1 < streamed[-1][0] < SHORT_LEASE.lease_s + 2


async def test_cancel_ends_a_run_whose_runner_died(tmp_path: Path) -> None:
    async with app(tmp_path / "cancel.db") as (api, store, _):
        await runner_gone(store, "resp_cancel")
        cancelled = await sdk_client(api).responses.cancel("resp_cancel")
        assert cancelled.status == "cancelled"
        events = await store.events_after("resp_cancel", -1)
        assert json.loads(events[-1][1])["type"] == "response.incomplete"


async def test_the_sweep_at_start_ends_the_runs_of_a_stopped_app(tmp_path: Path) -> None:
    async with app(tmp_path / "sweep.db") as (api, store, _):
        await runner_gone(store, "resp_swept")
        runner(api).start_sweeping()
        deadline = time.monotonic() + 5
        while (await store.get("resp_swept")).response["status"] != "failed":
            assert time.monotonic() < deadline, "the sweep did not end the lapsed run"
            await asyncio.sleep(0.05)


async def test_a_runner_whose_run_was_ended_elsewhere_stops_generating(tmp_path: Path) -> None:
    async with app(tmp_path / "lost.db") as (api, store, engine):
        created = await sdk_client(api).responses.create(
            model=MODEL, input="FOREVER", background=True
        )
        await asyncio.sleep(0.3)
        assert engine.num_ongoing_requests() == 1
        # Another replica found the lease lapsed (a long stall here) and ended the response.
        await store.end_run(created.id, ending, only_if_lapsed=False)
        deadline = time.monotonic() + 2
        while engine.num_ongoing_requests():
            assert time.monotonic() < deadline, "the runner kept generating"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert (await store.get(created.id)).response["status"] == "failed"  # not overwritten
        types = [json.loads(data)["type"] for _, data in await store.events_after(created.id, -1)]
        assert types.count("response.failed") == 1 and types[-1] == "response.failed"


async def test_a_replica_shut_down_without_grace_ends_its_runs_at_once(tmp_path: Path) -> None:
    async with app(tmp_path / "stop.db", lease=BackgroundArgs()) as (api, store, engine):
        created = await sdk_client(api).responses.create(
            model=MODEL, input="FOREVER", background=True
        )
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await runner(api).stop()
        assert time.monotonic() - started < 1  # not the 10 s lease
        stored = await store.get(created.id)
        assert stored.response["status"] == "failed"
        assert stored.response["error"]["code"] == INTERRUPTED_CODE
        assert engine.num_ongoing_requests() == 0
        types = [json.loads(data)["type"] for _, data in await store.events_after(created.id, -1)]
        assert types[-1] == "response.failed" and "response.incomplete" not in types


# --- a replica shutting down (Serve's graceful shutdown: the ingress's __del__) -------------


async def test_a_replica_shutting_down_lets_its_runs_finish(tmp_path: Path) -> None:
    db = tmp_path / "drain.db"
    lease = BackgroundArgs()
    async with app(db, lease) as (api, store, _), app(db, lease, "replica-b") as (other, _, _):
        client = sdk_client(api)
        created = await client.responses.create(model=MODEL, input="PAUSE", background=True)
        await asyncio.sleep(0.3)  # the reasoning is out; the engine pauses for PAUSE_S
        # A client following it through another replica, from where it is now.
        persisted = await store.events_after(created.id, -1)
        follower = asyncio.create_task(
            timed_events(runner(other).stream(created.id, persisted[-1][0]), 0)
        )
        started = time.monotonic()
        stopping = asyncio.create_task(runner(api).stop(grace_s=30))
        await asyncio.sleep(0.1)
        # No new run starts on a replica shutting down: a 503 clients retry (elsewhere).
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            refused = await http.post(
                "/v1/responses", json={"model": MODEL, "input": "QUICK", "background": True}
            )
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "server_error"
        assert not stopping.done()
        await stopping
        # It waited for the run (the pause), not for the grace.
        assert PAUSE_S - 0.5 < time.monotonic() - started < PAUSE_S + 3
        final = await client.responses.retrieve(created.id)
        assert final.status == "completed" and final.output_text == "After the pause."
        assert (await store.get_run(created.id)).ended
        rest = [data for _, data in await follower]
        assert rest[-1]["type"] == "response.completed"
        numbers = [number for number, _ in persisted] + [data["sequence_number"] for data in rest]
        assert numbers == list(range(len(numbers)))


async def test_a_run_that_outlasts_the_grace_is_failed_saying_why(tmp_path: Path) -> None:
    async with app(tmp_path / "late.db", BackgroundArgs()) as (api, store, engine):
        created = await sdk_client(api).responses.create(
            model=MODEL, input="FOREVER", background=True
        )
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await runner(api).stop(grace_s=1.0)
        assert 1.0 <= time.monotonic() - started < 2.5
        stored = await store.get(created.id)
        assert stored.response["status"] == "failed"
        assert stored.response["error"] == {"code": INTERRUPTED_CODE, "message": SHUT_DOWN_MESSAGE}
        assert [item["type"] for item in stored.output_items] == ["reasoning"]
        assert engine.num_ongoing_requests() == 0
        events = [json.loads(data) for _, data in await store.events_after(created.id, -1)]
        assert [data["sequence_number"] for data in events] == list(range(len(events)))
        assert [data["type"] for data in events].count("response.failed") == 1
        assert events[-1]["type"] == "response.failed"
        assert (await store.get_run(created.id)).ended
        assert await store.lapsed_runs() == []


@pytest.mark.parametrize("steps", range(0, 120, 6))
async def test_runs_starting_as_the_shutdown_begins_complete_or_are_refused(
    tmp_path: Path, steps: int
) -> None:
    """Each create racing the shutdown, whatever the interleaving (still being prepared, its
    claim in the store under way, its run not spawned yet), is either refused (503) or runs to
    its end before the shutdown is over; none is left running or failed by the shutdown."""
    async with app(tmp_path / "race.db", BackgroundArgs()) as (api, store, _):
        client = sdk_client(api)

        async def create() -> str | int:
            try:
                created = await client.responses.create(model=MODEL, input="QUICK", background=True)
            except openai.APIStatusError as error:
                return error.status_code
            return created.id

        creates = []
        for _ in range(4):  # each a few turns of the loop after the last
            creates.append(asyncio.create_task(create()))
            await asyncio.sleep(0)
        for _ in range(steps):  # the shutdown begins this many turns of the loop later
            await asyncio.sleep(0)
        await runner(api).stop(grace_s=10)
        # Nothing left running once the shutdown is over: Serve kills the replica then.
        for response_id in await store.ids():
            assert (await store.get(response_id)).response["status"] == "completed"
        outcomes = await asyncio.gather(*creates)
        for outcome in outcomes:
            if isinstance(outcome, int):
                assert outcome == 503
                continue
            stored = await store.get(outcome)
            assert stored.response["status"] == "completed", stored.response["error"]
            assert (await store.get_run(outcome)).ended
        assert await store.lapsed_runs() == []
