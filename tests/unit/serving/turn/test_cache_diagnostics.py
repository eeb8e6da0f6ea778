"""What the app's single deployment cannot show of prompt-cache diagnostics, in-process through
the openai SDK: ``model_changed`` (a comparison made by a deployment serving another model, on
the same store), an alias sharing its model's cache, ``unavailable`` (a response stored before
diagnostics, its store migrated), and what a stored response keeps (never the prompt's text)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from openai.types.responses.response import (
    PromptCacheDiagnosticsCacheHit,
    PromptCacheDiagnosticsCacheMiss,
    PromptCacheDiagnosticsUnavailable,
)

from serve_app.config import AppArgs
from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client

INSTRUCTIONS = "Answer briefly and precisely. " * 40


def _compare(comparison_id: str) -> dict:
    return {"prompt_cache_options": {"comparison_response_id": comparison_id}}


async def test_a_comparison_made_by_another_model_is_model_changed(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    small = AppArgs(model="gpt-oss-20b")
    async with in_process_api(db, small) as api:
        before = await sdk_client(api).responses.create(
            model="gpt-oss-20b", instructions=INSTRUCTIONS, input="hi"
        )
    aliased = AppArgs(model_aliases=["openai/gpt-oss-120b"])
    async with in_process_api(db, aliased) as api:
        client = sdk_client(api)
        after = await client.responses.create(
            model=MODEL, instructions=INSTRUCTIONS, input="hi", **_compare(before.id)
        )
        # Another name of the same model shares its cache.
        alias = await client.responses.create(
            model="openai/gpt-oss-120b", instructions=INSTRUCTIONS, input="hi", **_compare(after.id)
        )
    miss = after.prompt_cache_diagnostics
    assert isinstance(miss, PromptCacheDiagnosticsCacheMiss) and miss.reason == "model_changed"
    assert miss.comparison_reusable_tokens == 0
    assert miss.cache_missed_tokens == after.usage.input_tokens
    assert isinstance(alias.prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)


async def test_a_response_stored_before_diagnostics_is_unavailable(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    async with in_process_api(db) as api:
        old = await sdk_client(api).responses.create(model=MODEL, input="a secret-ish prompt")
    # The store as an older version left it: no fingerprint column (so none kept).
    with sqlite3.connect(db) as connection:
        kept = connection.execute(
            "SELECT prompt_fingerprint FROM responses WHERE id = ?", (old.id,)
        ).fetchone()[0]
        connection.execute("ALTER TABLE responses DROP COLUMN prompt_fingerprint")
    assert "secret" not in kept and '"blocks"' in kept  # digests only, never the text
    async with in_process_api(db) as api:  # starting migrates the store
        client = sdk_client(api)
        later = await client.responses.create(model=MODEL, input="again", **_compare(old.id))
        assert isinstance(later.prompt_cache_diagnostics, PromptCacheDiagnosticsUnavailable)
        # Responses made since keep theirs.
        again = await client.responses.create(model=MODEL, input="again", **_compare(later.id))
        assert isinstance(again.prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)
