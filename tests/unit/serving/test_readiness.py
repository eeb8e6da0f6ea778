"""`/health` (liveness) and `/ready` (readiness: the store and an engine answer): the ingress's
own FastAPI app in-process, with the real store and the simulated engine, one of them broken."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from serve_app.config import AppArgs
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.http.auth import ApiKeys
from serve_app.serving.ingress import create_api
from serve_app.serving.readiness import Readiness
from serve_app.store.sql import SqlResponseStore


class _DeadEngine(SimulatedEngine):
    async def check_health(self) -> None:
        raise RuntimeError("engine core died")


class _HungEngine(SimulatedEngine):
    async def check_health(self) -> None:
        await asyncio.Event().wait()


class _DeadStore(SqlResponseStore):
    async def ping(self) -> None:
        raise ConnectionRefusedError("connection refused")


@contextlib.asynccontextmanager
async def _api(
    tmp_path: Path,
    engine_class: type[SimulatedEngine] = SimulatedEngine,
    store_class: type[SqlResponseStore] = SqlResponseStore,
    **options: object,
) -> AsyncIterator[httpx.AsyncClient]:
    store = store_class(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    await store.start()
    engine = engine_class(SimulatedEngineConfig())
    await engine.start()
    api: FastAPI = create_api(
        AppArgs(), InProcessEngineClient(engine), ReasoningVault("k"), store, **options
    )
    transport = httpx.ASGITransport(app=api)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            yield http
    finally:
        await engine.shutdown()
        await store.close()


async def test_ready_when_the_store_and_an_engine_answer(tmp_path: Path) -> None:
    async with _api(tmp_path) as http:
        ready = await http.get("/ready")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "api": "open"}
        assert (await http.get("/health")).json() == {"status": "ok", "api": "open"}


async def test_a_dead_engine_is_a_503_naming_it_and_health_stays_ok(tmp_path: Path) -> None:
    async with _api(tmp_path, engine_class=_DeadEngine) as http:
        answer = await http.get("/ready")
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "server_error" and error["code"] == "service_unavailable"
        assert "engine: RuntimeError: engine core died" in error["message"]
        assert "store" not in error["message"]
        # Liveness is the replica's own: restarting it would not mend the engine.
        assert (await http.get("/health")).status_code == 200


async def test_a_dead_store_is_a_503_naming_it(tmp_path: Path) -> None:
    async with _api(tmp_path, store_class=_DeadStore) as http:
        answer = await http.get("/ready")
        assert answer.status_code == 503
        message = answer.json()["error"]["message"]
        assert "store: ConnectionRefusedError: connection refused" in message
        assert "engine" not in message


async def test_a_hung_engine_fails_within_the_timeout(tmp_path: Path) -> None:
    store = SqlResponseStore(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    await store.start()
    engine = _HungEngine(SimulatedEngineConfig())
    try:
        readiness = Readiness(store, InProcessEngineClient(engine), timeout_s=0.2)
        async with asyncio.timeout(5):
            assert await readiness.failures() == {"engine": "no answer within 0.2s"}
    finally:
        await store.close()


async def test_probes_need_no_key_and_say_the_api_is_closed(tmp_path: Path) -> None:
    async with _api(tmp_path, api_keys=ApiKeys(["sk-a"])) as http:
        assert (await http.get("/health")).json() == {"status": "ok", "api": "closed"}
        assert (await http.get("/ready")).json() == {"status": "ready", "api": "closed"}
        assert (await http.get("/v1/models")).status_code == 401


async def test_health_says_when_the_operator_opened_the_api(tmp_path: Path) -> None:
    async with _api(tmp_path, access="open") as http:
        assert (await http.get("/health")).json()["api"] == "open"


@pytest.mark.parametrize("url", ["sqlite+aiosqlite:///:memory:", "sqlite+aiosqlite://"])
async def test_an_in_memory_store_pings(url: str) -> None:
    store = SqlResponseStore(url)
    await store.start()
    try:
        await store.ping()
    finally:
        await store.close()
