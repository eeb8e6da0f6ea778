"""Overload: with every engine replica full and the queues full, new requests are turned away
at once with a retryable answer (429 + Retry-After; in a stream, rate_limit_exceeded with the
delay Codex waits), nothing hangs, and capacity comes back when the load goes."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

from tests.conftest import ENGINE_MAX_ONGOING, ENGINE_MAX_QUEUED, REPLICAS

pytestmark = pytest.mark.faults
MODEL = "gpt-oss-120b"
CAPACITY = REPLICAS * ENGINE_MAX_ONGOING + REPLICAS * ENGINE_MAX_QUEUED


async def open_slow_stream(http: httpx.AsyncClient, url: str, release: asyncio.Event) -> str:
    """Start a long turn; returns how it began: "admitted" or the failure code."""
    body = {
        "model": MODEL,
        "input": "SDK-SLOW: hold",
        "stream": True,
        "prompt_cache_key": str(uuid.uuid4()),
    }
    async with http.stream("POST", f"{url}/v1/responses", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.reasoning_text.done":
                await release.wait()  # hold the engine slot until the test lets go
                return "admitted"
            if event["type"] == "response.failed":
                error = event["response"]["error"]
                assert "try again in 1s" in error["message"]
                return error["code"]
    return "ended"


async def test_overload_is_answered_at_once_and_retryably(app_url: str) -> None:
    release = asyncio.Event()
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        streams = [
            asyncio.create_task(open_slow_stream(http, app_url, release))
            for _ in range(CAPACITY + 12)
        ]
        done, _ = await asyncio.wait(streams, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        assert done, "no request was turned away"
        await asyncio.sleep(2)  # let the rest settle into engine slots and queues
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
    assert outcomes.count("admitted") >= REPLICAS * ENGINE_MAX_ONGOING - 2
    assert set(outcomes) <= {"admitted", "rate_limit_exceeded"}

    async with httpx.AsyncClient(timeout=60) as http:  # capacity is back
        for _ in range(30):
            answer = await http.post(
                f"{app_url}/v1/responses", json={"model": MODEL, "input": "SDK-TEXT"}
            )
            if answer.status_code == 200:
                break
            await asyncio.sleep(1)
        assert answer.status_code == 200 and answer.json()["status"] == "completed"
