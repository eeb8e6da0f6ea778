"""Overload: with every engine replica full and the queues full, new requests are turned away
at once with a retryable answer (429 + Retry-After, a stream's before any event, as OpenAI's;
the message names the delay Codex waits), nothing hangs, and capacity comes back when the load
goes. The requests carry the session's first API key (the app may be closed: `SERVE_APP_API_KEYS`
names it)."""

from __future__ import annotations

import asyncio
import csv
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import ENGINE_MAX_ONGOING, ENGINE_MAX_QUEUED, REPLICAS
from tests.support import API_KEY, AUTH, MODEL
from tests.support.helpers import run_locust
from tests.support.replicas import call_deployment, engine_replica_actors

pytestmark = pytest.mark.faults
CAPACITY = REPLICAS * ENGINE_MAX_ONGOING + REPLICAS * ENGINE_MAX_QUEUED


async def open_slow_stream(
    http: httpx.AsyncClient, url: str, release: asyncio.Event, admitted: list[str]
) -> str:
    """Start a long turn; returns how it began: "admitted" or the failure code. An admitted
    stream is appended to ``admitted`` as soon as it holds an engine slot."""
    body = {
        "model": MODEL,
        "input": "SDK-SLOW: hold",
        "stream": True,
        "prompt_cache_key": str(uuid.uuid4()),
    }
    async with http.stream("POST", f"{url}/v1/responses", json=body, headers=AUTH) as response:
        if response.status_code == 429:  # refused before the stream (issue 38)
            error = json.loads(await response.aread())["error"]
            assert "try again in 1s" in error["message"]
            assert response.headers["retry-after"] == "1"
            return error["code"]
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.reasoning_text.done":
                admitted.append(body["prompt_cache_key"])
                await release.wait()  # hold the engine slot until the test lets go
                return "admitted"
            if event["type"] == "response.failed":
                error = event["response"]["error"]
                assert "try again in 1s" in error["message"]
                return error["code"]
    return "ended"


async def fill_until_turned_away(
    http: httpx.AsyncClient, url: str, release: asyncio.Event, admitted: list[str]
) -> list[asyncio.Task[str]]:
    """Open slow streams one at a time until every engine slot is held and one stream has been
    turned away. (A single burst would be turned away by a handle's full queue while replicas
    still have free slots: Ray counts a request as queued while it is being assigned.)"""
    streams: list[asyncio.Task[str]] = []
    for _ in range(CAPACITY + 24):
        streams.append(asyncio.create_task(open_slow_stream(http, url, release, admitted)))
        await asyncio.sleep(0.1)
        turned_away = any(stream.done() for stream in streams)
        if turned_away and len(admitted) >= REPLICAS * ENGINE_MAX_ONGOING:
            break
    return streams


def engines_idle() -> bool:
    """Whether no engine replica generates anything: an earlier test's streams hold no slot.
    (Behind HAProxy a client that left is seen only at the stream's next write, the SSE
    keep-alive after 5-10 s of silence: its engine request runs until then.)"""
    return all(
        call_deployment(actor, "num_ongoing_requests") == 0 for actor in engine_replica_actors()
    )


async def eventually(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_overload_is_answered_at_once_and_retryably(app_url: str, app_cluster: None) -> None:
    assert await eventually(engines_idle, timeout=60), "an earlier test's requests still run"
    release = asyncio.Event()
    admitted: list[str] = []
    engine_slots = REPLICAS * ENGINE_MAX_ONGOING
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(timeout=60, limits=limits, headers=AUTH) as http:
        streams = await fill_until_turned_away(http, app_url, release, admitted)
        assert any(stream.done() for stream in streams), "no request was turned away"
        assert await eventually(lambda: len(admitted) >= engine_slots, timeout=30), (
            f"only {len(admitted)} of {engine_slots} engine slots were taken"
        )
        # Non-streaming requests now: those answered at once get 429 with Retry-After (the
        # rest found room in a queue and wait for capacity).
        probes = [
            asyncio.create_task(
                http.post(f"{app_url}/v1/responses", json={"model": MODEL, "input": "SDK-TEXT"})
            )
            for _ in range(8)
        ]
        answered, _ = await asyncio.wait(probes, timeout=5)
        assert answered, "every request waited: nothing was turned away"
        for probe in answered:
            busy = probe.result()
            assert busy.status_code == 429, busy.text
            assert busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["code"] == "rate_limit_exceeded"

        release.set()  # the clients disconnect; their engine requests are aborted
        outcomes = await asyncio.wait_for(asyncio.gather(*streams), timeout=60)
        for probe in await asyncio.wait_for(asyncio.gather(*probes), timeout=60):
            assert probe.status_code in (200, 429)  # queued ones completed once load went
    assert outcomes.count("rate_limit_exceeded") >= 1
    assert outcomes.count("admitted") >= engine_slots
    assert set(outcomes) <= {"admitted", "rate_limit_exceeded"}

    async with httpx.AsyncClient(timeout=60, headers=AUTH) as http:  # capacity is back
        for _ in range(30):
            answer = await http.post(
                f"{app_url}/v1/responses", json={"model": MODEL, "input": "SDK-TEXT"}
            )
            if answer.status_code == 200:
                break
            await asyncio.sleep(1)
        assert answer.status_code == 200 and answer.json()["status"] == "completed"


async def test_a_stream_the_full_engines_refuse_is_a_429_before_any_event(
    app_url: str, app_cluster: None
) -> None:
    """Before issue 38: ``200``, ``response.created``, then ``response.failed`` with
    ``rate_limit_exceeded`` inside the stream, which the SDK does not retry and a load balancer
    counts as a success. Now the refusal comes before the stream, as OpenAI's: HTTP 429 with
    Retry-After, and the openai SDK raises `RateLimitError` from ``create(stream=True)``."""
    release = asyncio.Event()
    admitted: list[str] = []
    limits = httpx.Limits(max_connections=200)
    assert await eventually(engines_idle, timeout=60), "an earlier test's requests still run"
    sdk = openai.AsyncOpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    async with httpx.AsyncClient(timeout=60, limits=limits, headers=AUTH) as http:
        streams = await fill_until_turned_away(http, app_url, release, admitted)
        assert any(stream.done() for stream in streams), "no request was turned away"
        assert await eventually(lambda: len(admitted) >= REPLICAS * ENGINE_MAX_ONGOING, 30)

        async def streamed_probe() -> object:
            """What ``create(stream=True)`` does now: raises, or a stream (read to its end)."""
            try:
                stream = await sdk.responses.create(model=MODEL, input="SDK-TEXT", stream=True)
            except openai.APIStatusError as refused:
                return refused
            return [event.type async for event in stream]

        async def raw_probe() -> httpx.Response:
            body = {"model": MODEL, "input": "SDK-TEXT", "stream": True}
            return await http.post(f"{app_url}/v1/responses", json=body)

        probes = [asyncio.create_task(streamed_probe()) for _ in range(6)]
        probes += [asyncio.create_task(raw_probe()) for _ in range(6)]
        answered, _ = await asyncio.wait(probes, timeout=5)
        assert answered, "every streamed request waited: nothing was turned away"
        for probe in answered:
            match probe.result():
                case openai.RateLimitError() as refused:
                    assert refused.status_code == 429
                    assert refused.code == "rate_limit_exceeded"
                    assert refused.response.headers["retry-after"] == "1"
                case httpx.Response() as raw:
                    assert raw.status_code == 429, raw.text[:500]
                    assert raw.headers["content-type"] == "application/json"
                    assert raw.headers["retry-after"] == "1"
                    assert raw.json()["error"]["code"] == "rate_limit_exceeded"
                case other:
                    pytest.fail(f"a streamed request answered at once, not refused: {other!r}")
        release.set()
        await asyncio.wait_for(asyncio.gather(*streams), timeout=60)
        await asyncio.wait_for(asyncio.gather(*probes), timeout=60)  # queued ones complete
    await sdk.close()


def test_locust_at_four_times_capacity_loses_nothing_and_hangs_nothing(
    app_url: str, tmp_path: Path
) -> None:
    # Codex sessions with no think time, four per request the app can hold (engine slots and
    # queues): most turns are turned away, each with a retryable answer, none hangs.
    users = 4 * CAPACITY
    prefix = tmp_path / "overload"
    result = run_locust(
        app_url, prefix, users=users, seconds=20, TRACE_TIME_SCALE="0", TURN_TIMEOUT_S="60"
    )
    stats = {row["Type"]: row for row in read_csv(prefix.with_name("overload_stats.csv"))}
    assert "POST" in stats, result.stderr[-3000:]
    requests, failed = int(stats["POST"]["Request Count"]), int(stats["POST"]["Failure Count"])
    assert requests - failed >= CAPACITY  # served: at least one turn per slot
    assert failed > 0, "four times capacity and nothing was turned away"
    print(
        f"locust, {users} users: {requests} turns, {requests - failed} served, {failed} turned away"
    )
    # Every failure is a turn turned away: HTTP 429, or a stream ended with rate_limit_exceeded.
    for failure in read_csv(prefix.with_name("overload_failures.csv")):
        error = failure["Error"]  # e.g. CatchResponseError('HTTP 429: rate_limit_exceeded')
        turned_away = ("HTTP 429: rate_limit_exceeded", "response.failed: rate_limit_exceeded")
        assert any(reason in error for reason in turned_away), failure
    # No timeout, no dropped connection, no malformed stream: those would be exceptions.
    assert read_csv(prefix.with_name("overload_exceptions.csv")) == []
    with httpx.Client(headers=AUTH, timeout=60) as http:  # capacity is back
        answer = http.post(f"{app_url}/v1/responses", json={"model": MODEL, "input": "SDK-TEXT"})
    assert answer.status_code == 200 and answer.json()["status"] == "completed"


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))
