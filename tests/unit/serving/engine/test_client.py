"""The engine client turns Ray's back-pressure error into ours (`RateLimited`), so the service
needs no Ray: a caller refused before its first event gets 429 with Retry-After (a non-streaming
one, a stream: before any event, as OpenAI's; a WebSocket: an error event, no
``response.created``); a background response, announced before the engine is asked, ends
``failed`` with ``rate_limit_exceeded``. A stream's ``response.created`` comes as the engine
replica takes the request, before its first token. No Ray: stand-ins for the Serve handle."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from ray.serve.exceptions import BackPressureError
from websockets.asyncio.client import connect

from serve_app.config import AppArgs, StreamingArgs
from serve_app.engines.base import GenerateRequest, SamplingSettings
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.errors import RETRY_AFTER_S, RateLimited
from serve_app.serving.engine.client import HandleEngineClient
from serve_app.serving.engine.liveness import Watchdog
from serve_app.serving.ingress import create_api
from serve_app.store.sql import SqlResponseStore
from tests.support import MODEL
from tests.support.helpers import on_uvicorn, sdk_client
from tests.unit.serving.engine.test_channel import CALLER, _BareReplica, _Handle, _Recording


class _FullQueue:
    """A streamed handle call that Serve turns away: every replica and the queue are full. As
    Ray 2.60's, cancelling it raises the back-pressure error again (``cancel`` fetches the
    assignment's result first)."""

    def __aiter__(self) -> _FullQueue:
        return self

    async def __anext__(self) -> Any:
        raise BackPressureError(num_queued_requests=4, max_queued_requests=4)

    def cancel(self) -> None:
        raise BackPressureError(num_queued_requests=4, max_queued_requests=4)


class _BusyHandle:
    """The few handle methods `HandleEngineClient` calls: ``options(...).generate.remote()``."""

    def __init__(self) -> None:
        self.calls: list[_FullQueue] = []

    def options(self, **_: Any) -> _BusyHandle:
        return self

    @property
    def generate(self) -> _BusyHandle:
        return self

    def remote(self, *_: Any, **__: Any) -> _FullQueue:
        self.calls.append(_FullQueue())
        return self.calls[-1]


async def test_back_pressure_comes_out_as_rate_limited() -> None:
    handle = _BusyHandle()
    request = GenerateRequest("r1", [1, 2, 3], SamplingSettings(max_tokens=4))
    with pytest.raises(RateLimited) as caught:
        async for _ in HandleEngineClient(handle).stream(request):
            pass
    busy = caught.value
    assert (busy.status_code, busy.code) == (429, "rate_limit_exceeded")
    assert busy.headers == {"Retry-After": str(RETRY_AFTER_S)}
    assert f"try again in {RETRY_AFTER_S}s" in busy.message


@pytest.fixture
async def busy_api(tmp_path: Path) -> Any:
    store = SqlResponseStore(f"sqlite+aiosqlite:///{tmp_path / 'busy.db'}")
    await store.start()
    yield create_api(AppArgs(), HandleEngineClient(_BusyHandle()), ReasoningVault("k"), store)
    await store.close()


@pytest.fixture
async def busy_app(busy_api: Any) -> Any:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=busy_api), base_url="http://app"
    ) as client:
        yield client


def _check_refusal(status: int, headers: httpx.Headers, body: dict) -> None:
    assert status == 429
    assert headers["retry-after"] == str(RETRY_AFTER_S)
    assert headers["content-type"] == "application/json"
    error = body["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert f"Please try again in {RETRY_AFTER_S}s." in error["message"]


async def test_a_non_streaming_caller_gets_429_with_retry_after(busy_app) -> None:
    answer = await busy_app.post("/v1/responses", json={"model": MODEL, "input": "hi"})
    _check_refusal(answer.status_code, answer.headers, answer.json())


async def test_a_refused_stream_is_a_429_before_any_event(busy_app, busy_api) -> None:
    # Before: a 200 stream of response.created, response.in_progress, then response.failed.
    body = {"model": MODEL, "input": "hi", "stream": True}
    answer = await busy_app.post("/v1/responses", json=body)
    assert "data:" not in answer.text
    _check_refusal(answer.status_code, answer.headers, answer.json())
    # The openai SDK raises at once (and would retry it, as it retries every 429).
    with pytest.raises(openai.RateLimitError) as raised:
        await sdk_client(busy_api).responses.create(model=MODEL, input="hi", stream=True)
    assert raised.value.code == "rate_limit_exceeded"


async def test_a_refused_websocket_response_is_an_error_event(busy_api) -> None:
    create = {"type": "response.create", "model": MODEL, "input": "hi"}
    async with on_uvicorn(busy_api) as url:
        socket_url = url.replace("http://", "ws://") + "/v1/responses"
        async with connect(socket_url) as socket:
            for _ in range(2):  # the connection stays open for the next
                await socket.send(json.dumps(create))
                event = json.loads(await asyncio.wait_for(socket.recv(), 10))
                assert (event["type"], event["status"]) == ("error", 429), event
                assert event["error"]["code"] == "rate_limit_exceeded"


async def test_a_refused_background_response_ends_failed_rate_limited(busy_app) -> None:
    body = {"model": MODEL, "input": "hi", "background": True}
    created = (await busy_app.post("/v1/responses", json=body)).json()
    assert created["status"] in ("queued", "in_progress")  # its 200 came before the engine
    for _ in range(100):
        stored = (await busy_app.get(f"/v1/responses/{created['id']}")).json()
        if stored["status"] not in ("queued", "in_progress"):
            break
        await asyncio.sleep(0.05)
    assert stored["status"] == "failed"
    assert stored["error"]["code"] == "rate_limit_exceeded"


@pytest.fixture
async def slow_prefill_api(tmp_path: Path) -> Any:
    """The app over the engine deployment's class on the simulated engine with a prefill of
    about a second, behind the stand-in for Ray's handle calls (no channels: each request on
    its own stream, where the first token comes only after the prefill)."""
    engine = _Recording(SimulatedEngineConfig(prefill_tokens_per_s=60, default_output_tokens=8))
    await engine.start()
    replica = _BareReplica.__new__(_BareReplica)
    # No heartbeat during the prefill, so only the replica's word that it has the request can
    # open the stream before the first token.
    replica._serve(engine, "engine-1", streaming=StreamingArgs(heartbeat_s=10))
    store = SqlResponseStore(f"sqlite+aiosqlite:///{tmp_path / 'slow.db'}")
    await store.start()
    watchdog = Watchdog(silence_s=20)
    client = HandleEngineClient(_Handle(replica), CALLER, channels=False, watchdog=watchdog)
    yield create_api(AppArgs(), client, ReasoningVault("k"), store)
    await store.close()
    await engine.shutdown()


async def test_a_stream_is_opened_when_the_engine_takes_it_not_at_its_first_token(
    slow_prefill_api,
) -> None:
    body = {"model": MODEL, "input": "hi", "stream": True}
    async with on_uvicorn(slow_prefill_api) as url, httpx.AsyncClient(timeout=30) as http:
        started = time.monotonic()
        async with http.stream("POST", f"{url}/v1/responses", json=body) as answer:
            headers_at = time.monotonic() - started
            seen: dict[str, float] = {}
            async for line in answer.aiter_lines():
                if line.startswith("data: "):
                    seen.setdefault(json.loads(line[6:])["type"], time.monotonic() - started)
    assert answer.status_code == 200
    first_token_at = min(t for kind, t in seen.items() if kind.endswith(".delta"))
    assert first_token_at > 0.5, seen  # the prefill took that long
    # The 200 and response.created came as the replica took it, not with the first token.
    assert headers_at < 0.3 and seen["response.created"] < 0.3, (headers_at, seen)


async def test_a_refused_turn_due_a_compaction_is_a_429_before_any_event(busy_app) -> None:
    # Server-side compaction asks the engine for the summary first: its refusal comes before
    # the compaction item opens, so before response.created too.
    history = [{"role": "user", "content": "OLD-TOOL-OUTPUT " + "sunny and warm, " * 300}]
    body = {
        "model": MODEL,
        "input": history,
        "stream": True,
        "context_management": [{"type": "compaction", "compact_threshold": 1000}],
    }
    answer = await busy_app.post("/v1/responses", json=body)
    assert "data:" not in answer.text
    _check_refusal(answer.status_code, answer.headers, answer.json())


class _Unary:
    """``handle.options(stream=False).check_health.remote()``: awaiting it raises ``error``
    (None: the replica answered)."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.calls = 0

    def options(self, **_: Any) -> _Unary:
        return self

    @property
    def check_health(self) -> _Unary:
        return self

    def remote(self) -> Any:
        self.calls += 1

        async def answer() -> None:
            if self.error is not None:
                raise self.error

        return answer()


async def test_ping_asks_an_engine_replica_and_reads_back_pressure_as_busy() -> None:
    """Readiness: a replica's health check through the handle; an error is the engine's; every
    replica and the queue full is busy, not broken."""
    answered = _Unary(None)
    await HandleEngineClient(answered).ping()
    assert answered.calls == 1
    await HandleEngineClient(
        _Unary(BackPressureError(num_queued_requests=4, max_queued_requests=4))
    ).ping()
    with pytest.raises(RuntimeError, match="engine core died"):
        await HandleEngineClient(_Unary(RuntimeError("engine core died"))).ping()
