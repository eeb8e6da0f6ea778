"""The engine client turns Ray's back-pressure error into ours (`RateLimited`), so the service
needs no Ray: a non-streaming caller gets 429 with Retry-After, a stream ends with
``response.failed`` and ``rate_limit_exceeded``. No Ray: a stand-in for the Serve handle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from ray.serve.exceptions import BackPressureError

from serve_app.config import AppArgs
from serve_app.engines.base import GenerateRequest, SamplingSettings
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.errors import RETRY_AFTER_S, RateLimited
from serve_app.serving.engine.client import HandleEngineClient
from serve_app.serving.ingress import create_api
from serve_app.store.sql import SqlResponseStore
from tests.support import MODEL


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
async def busy_app(tmp_path: Path) -> Any:
    store = SqlResponseStore(f"sqlite+aiosqlite:///{tmp_path / 'busy.db'}")
    await store.start()
    api = create_api(AppArgs(), HandleEngineClient(_BusyHandle()), ReasoningVault("k"), store)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://app"
    ) as client:
        yield client
    await store.close()


async def test_a_non_streaming_caller_gets_429_with_retry_after(busy_app) -> None:
    answer = await busy_app.post("/v1/responses", json={"model": MODEL, "input": "hi"})
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == str(RETRY_AFTER_S)
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert f"Please try again in {RETRY_AFTER_S}s." in error["message"]


async def test_a_stream_ends_with_response_failed_rate_limited(busy_app) -> None:
    body = {"model": MODEL, "input": "hi", "stream": True}
    answer = await busy_app.post("/v1/responses", json=body)
    assert answer.status_code == 200
    last = [line for line in answer.text.splitlines() if line.startswith("data: ")][-1]
    assert '"type":"response.failed"' in last.replace(" ", "")
    assert '"code":"rate_limit_exceeded"' in last.replace(" ", "")


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
