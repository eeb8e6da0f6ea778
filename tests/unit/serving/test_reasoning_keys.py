"""The reasoning key ingress replicas share (serve_app/serving/reasoning_keys.py): generated
once in the store when the operator sets none, the operator's when set, a list for rotation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from serve_app.config import SecretArgs
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.serving.reasoning_keys import GENERATED_KEY_NAME, shared_vault
from serve_app.store.sql import SqlResponseStore

REPLICAS = 4
COMPACTION = b"compaction"


@pytest.fixture
async def store_file(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'responses.db'}"


@pytest.fixture
async def store(store_file: str) -> AsyncIterator[SqlResponseStore]:
    store = SqlResponseStore(store_file)
    await store.start()
    yield store
    await store.close()


async def replica_vaults(store_file: str, secrets: SecretArgs) -> list[ReasoningVault]:
    """The vaults of replicas starting at once on one store, each with its own connections."""
    stores = [SqlResponseStore(store_file) for _ in range(REPLICAS)]
    try:
        await asyncio.gather(*(store.start() for store in stores))
        return list(await asyncio.gather(*(shared_vault(secrets, store) for store in stores)))
    finally:
        await asyncio.gather(*(store.close() for store in stores))


async def test_replicas_with_no_operator_key_share_one_generated_key(store_file: str) -> None:
    vaults = await replica_vaults(store_file, SecretArgs())
    blobs = [vault.seal(f"from replica {index}", COMPACTION) for index, vault in enumerate(vaults)]
    for vault in vaults:
        opened = [vault.open(blob, COMPACTION) for blob in blobs]
        assert opened == [f"from replica {index}" for index in range(REPLICAS)]
    # A restart (a new replica on the same store) opens what the earlier ones sealed.
    (restarted, *_) = await replica_vaults(store_file, SecretArgs())
    assert restarted.open(blobs[0], COMPACTION) == "from replica 0"


async def test_an_operator_key_seals_and_the_generated_one_still_opens(
    store: SqlResponseStore,
) -> None:
    generated = await shared_vault(SecretArgs(), store)
    before = generated.seal("sealed under the generated key")
    operator = await shared_vault(SecretArgs(reasoning_key="operator-key"), store)
    assert operator.open(before) == "sealed under the generated key"
    after = operator.seal("sealed under the operator's key")
    assert ReasoningVault("operator-key").open(after) == "sealed under the operator's key"
    assert generated.open(after) is None  # the operator's key seals, not the generated one
    # The generated key is read, never replaced: it is the same row as before.
    assert await store.shared_secret(GENERATED_KEY_NAME, None) is not None


async def test_an_operator_key_makes_no_key_in_the_store(store: SqlResponseStore) -> None:
    vault = await shared_vault(SecretArgs(reasoning_key="operator-key"), store)
    assert await store.shared_secret(GENERATED_KEY_NAME, None) is None
    assert ReasoningVault("operator-key").open(vault.seal("x")) == "x"


async def test_the_operator_rotates_with_a_comma_separated_list(store: SqlResponseStore) -> None:
    old = await shared_vault(SecretArgs(reasoning_key="key-1"), store)
    old_blob = old.seal("plan", COMPACTION, owner="alice")
    rotated = await shared_vault(SecretArgs(reasoning_key=" key-2 , key-1 ,"), store)
    assert rotated.open(old_blob, COMPACTION, owner="alice") == "plan"
    new_blob = rotated.seal("new plan", COMPACTION, owner="alice")
    assert ReasoningVault("key-2").open(new_blob, COMPACTION, owner="alice") == "new plan"
    retired = await shared_vault(SecretArgs(reasoning_key="key-2"), store)
    assert retired.open(old_blob, COMPACTION, owner="alice") is None
    assert retired.open(new_blob, COMPACTION, owner="alice") == "new plan"


async def test_the_environment_key_list_overrides_the_config(
    store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVE_APP_REASONING_KEY", "env-new,env-old")
    vault = await shared_vault(SecretArgs(reasoning_key="config-key").resolved(), store)
    assert vault.open(ReasoningVault("env-old").seal("x")) == "x"
    assert vault.open(ReasoningVault("config-key").seal("x")) is None
    assert ReasoningVault("env-new").open(vault.seal("y")) == "y"
