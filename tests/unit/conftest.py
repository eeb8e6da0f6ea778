"""Unit tests build their own configuration. The serve tier's MCP allowlist, which
tests/support/mcp_app.py puts in this process's environment for the app it starts (plain
``pytest`` runs both tiers in one process), is no unit test's: `ToolArgs` would read it as the
operator's override of every allowlist a test sets."""

from __future__ import annotations

import pytest

from serve_app.config import MCP_ALLOW_ENV


@pytest.fixture(autouse=True)
def _no_serve_tier_mcp_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MCP_ALLOW_ENV, raising=False)
