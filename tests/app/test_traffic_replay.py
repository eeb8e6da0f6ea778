"""Every recorded client's bytes through the running app (issue 45): each file of the corpus
(tests/fixtures/traffic/, recorded by scripts/record_traffic.py from the real clients of
tests/clients/) replayed in order (tests/support/traffic.py says what a replay changes), each
answered as recorded with every event valid as the openai SDK types it.

The session app is the recording's app on Ray (configs/local.yaml with the test bounds, the
MCP allowlist of tests/support/mcp_app.py): it answers everything as recorded. The fast-path
stage of scripts/test.sh runs this module again behind HAProxy and direct ingress; the shipped
configs' replay is tests/deploy/test_traffic_replay.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support import API_KEY
from tests.support.mcp_app import everything_server, port
from tests.support.mcp_servers import KINDS, mcp_server
from tests.support.traffic import corpus_files, file_id, load, replay


@contextlib.contextmanager
def mcp_servers_for(recording: Mapping[str, Any]) -> Iterator[dict[str, str]]:
    """The test MCP servers the recording named, each at its role's port here: their origins
    by role. A role named after a kind runs that kind; ``everything`` runs npm's
    server-everything; any other (``agents``), the ``good`` server its tests start there."""
    origins: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for role in sorted(set(recording["mcp_servers"].values())):
            if role == "everything":
                stack.enter_context(everything_server(role))
            else:
                kind = role if role in KINDS else "good"
                stack.enter_context(mcp_server(kind, port=port(role)))
            origins[role] = f"http://127.0.0.1:{port(role)}"
        yield origins


@pytest.mark.parametrize("path", corpus_files(), ids=file_id)
async def test_every_recorded_body_through_the_running_app(app_url: str, path: Path) -> None:
    with mcp_servers_for(load(path)) as origins:
        deviation = await replay(path, app_url, API_KEY, origins)
    assert deviation is None, f"the app refuses {file_id(path)}: {deviation}"
