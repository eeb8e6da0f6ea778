"""WebSocket lanes and steering against the app in this process (uvicorn, the scripted
simulated engine), where its limits can be small and its engine seen: a connection's lanes and
queued requests are bounded, and a steered response's engine request is aborted. The rest,
through the SDK against the running app: tests/app/test_websocket_lanes.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from openai import AsyncOpenAI
from openai.types.responses import ResponseSteerAcceptedEvent

from serve_app.config import AppArgs, Limits
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from tests.support import ENGINE_SCRIPT, MODEL
from tests.support.helpers import in_process_api, on_uvicorn
from tests.support.websocket import TERMINAL


@asynccontextmanager
async def small_app(
    tmp_path: Path, **limits: int
) -> AsyncIterator[tuple[AsyncOpenAI, SimulatedEngine]]:
    """The app on uvicorn with these `Limits` and the scripted engine: an SDK client for it,
    and the engine."""
    scripted = SimulatedEngineConfig(script=str(ENGINE_SCRIPT), decode_tokens_per_s=50_000)
    args = AppArgs(limits=Limits(**limits))
    async with (
        in_process_api(tmp_path / "lanes.db", args, engine=scripted) as api,
        on_uvicorn(api) as url,
    ):
        yield AsyncOpenAI(base_url=f"{url}/v1", api_key="unused"), api.state.engine


async def test_lanes_and_queued_requests_are_bounded_per_connection(tmp_path: Path) -> None:
    limits = {"max_websocket_lanes": 2, "max_websocket_queued_requests": 2}
    async with (
        small_app(tmp_path, **limits) as (client, _),
        client.responses.connect() as connection,
    ):

        async def create(lane: str) -> None:
            await connection.response.create(model=MODEL, input=f"LANE-WAIT {lane}", stream_id=lane)

        await create("a")
        await create("b")
        await create("c")  # a third lane while two are busy
        await create("a")  # queued behind a's first
        await create("b")  # queued: two queued now
        await create("a")  # a third queued request
        events = []
        while sum(1 for e in events if e.type in TERMINAL) < 4:
            events.append(await asyncio.wait_for(connection.recv(), 30))
        refusals = [e for e in events if e.type == "error"]
        assert [(e.stream_id, e.status, e.error.code) for e in refusals] == [
            ("c", 429, "rate_limit_exceeded"),
            ("a", 429, "rate_limit_exceeded"),
        ]
        assert (
            refusals[0].error.param == "stream_id" and refusals[0].error.type == "rate_limit_error"
        )
        assert "queued" in refusals[1].error.message
        done = [(e.stream_id, e.type) for e in events if e.type in TERMINAL]
        assert sorted(done) == [("a", "response.completed")] * 2 + [("b", "response.completed")] * 2
        # The lanes are free again: lane c is served now, on the same connection.
        await create("c")
        while (event := await asyncio.wait_for(connection.recv(), 30)).type not in TERMINAL:
            assert event.stream_id == "c"
        assert event.type == "response.completed"


async def test_a_steered_response_aborts_its_engine_request(tmp_path: Path) -> None:
    async with small_app(tmp_path) as (client, engine), client.responses.connect() as connection:
        await connection.response.create(model=MODEL, input="STEER-ABORT: go", store=False)
        created = await asyncio.wait_for(connection.recv(), 30)
        while (
            await asyncio.wait_for(connection.recv(), 30)
        ).type != "response.reasoning_text.delta":
            pass  # the final answer's first word comes after a pause, then a long one
        target = created.response.id
        await connection.response.steer(previous_response_id=target, input="STEER-FOLLOW: stop")
        events = []
        while (event := await asyncio.wait_for(connection.recv(), 10)).type not in TERMINAL:
            events.append(event)
        assert any(isinstance(e, ResponseSteerAcceptedEvent) for e in events)
        assert event.response.incomplete_details.reason == "steered"
        # Its engine would have slept 30 s in the final answer it had begun: it was aborted.
        assert [item.type for item in event.response.output] == ["reasoning"]
        while (event := await asyncio.wait_for(connection.recv(), 10)).type not in TERMINAL:
            pass
        assert event.response.output_text == "A small plan."
        assert engine.num_ongoing_requests() == 0
