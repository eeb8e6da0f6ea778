"""The store's connection pool is sized by `StoreConfig` (SQLAlchemy's default, 5 + 10, against
an ingress replica's hundreds of ongoing requests, was the store's bottleneck)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy.exc
from sqlalchemy import text

from serve_app.config import AppArgs, StoreConfig
from serve_app.store.sql import SqlResponseStore


def test_the_default_pool_is_larger_than_sqlalchemys() -> None:
    store = AppArgs().store
    assert store.pool_size + store.max_overflow >= 32
    assert AppArgs.model_validate({"store": {"pool_size": 40}}).store.pool_size == 40
    with pytest.raises(ValueError):
        StoreConfig(pool_size=0)


async def test_the_pool_has_the_configured_size(tmp_path: Path) -> None:
    store = SqlResponseStore(
        f"sqlite+aiosqlite:///{tmp_path / 'r.db'}", StoreConfig(pool_size=24, max_overflow=8)
    )
    await store.start()
    try:
        pool = store._engine.pool  # what SQLAlchemy was given
        assert pool.size() == 24 and pool._max_overflow == 8
    finally:
        await store.close()


async def test_connections_beyond_the_pool_wait_pool_timeout_s(tmp_path: Path) -> None:
    """Two connections held, a pool of 1 + 1: the next read waits ``pool_timeout_s`` and fails;
    once one is given back, it succeeds."""
    config = StoreConfig(pool_size=1, max_overflow=1, pool_timeout_s=0.3)
    store = SqlResponseStore(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}", config)
    await store.start()
    try:
        engine = store._engine
        first, second = await engine.connect(), await engine.connect()
        await first.execute(text("SELECT 1"))
        await second.execute(text("SELECT 1"))
        started = asyncio.get_running_loop().time()
        with pytest.raises(sqlalchemy.exc.TimeoutError):
            await store.ping()
        assert asyncio.get_running_loop().time() - started >= 0.25
        await first.close()
        await store.ping()
        await second.close()
    finally:
        await store.close()
