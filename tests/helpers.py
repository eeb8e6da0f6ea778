"""Shared test helpers: Codex capture fixtures and harmony decoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serve_app.harmony.encoding import get_encoding

REPO = Path(__file__).resolve().parents[1]
# ../shared/codex holds real Codex request captures (the steering repo's shared folder).
SHARED_CODEX = REPO.parent / "shared" / "codex"
CAPTURES = sorted((SHARED_CODEX / "captures").glob("*/req_*.json"))


def capture_body(name: str) -> dict[str, Any]:
    """The request body of a capture, e.g. ``capture_body("tool/req_002")``."""
    return json.loads((SHARED_CODEX / "captures" / f"{name}.json").read_text())["body"]


def decode(token_ids: list[int]) -> str:
    return get_encoding().decode_utf8(token_ids)


def scrape_metrics(app_url: str, replicas: int = 2, tries: int = 40) -> dict[str, str]:
    """/metrics of every ingress replica (each keeps its own counters), by replica id."""
    import httpx

    pages: dict[str, str] = {}
    for _ in range(tries):
        response = httpx.get(f"{app_url}/metrics", timeout=30)
        pages[response.headers["x-serve-app-replica"]] = response.text
        if len(pages) == replicas:
            break
    return pages


def run_locust(
    app_url: str, prefix: Path, users: int, seconds: int, **env: str
) -> subprocess.CompletedProcess[str]:
    """Replay the sample Codex traces with loadtests/locustfile.py, headless; CSVs at ``prefix``."""
    locust = Path(sys.executable).parent / "locust"
    command = [str(locust), "-f", str(REPO / "loadtests" / "locustfile.py"), "--headless"]
    command += ["-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--stop-timeout", "60"]
    command += ["--host", app_url, "--csv", str(prefix), "--only-summary"]
    return subprocess.run(
        command,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )


def engine_ongoing(handle, key: str) -> int:
    """Requests in flight on the engine replica that serves ``key``: the call carries the same
    routing key as the requests, so the router sends it to the same replica."""
    return handle.options(session_id=key).num_ongoing_requests.remote().result(timeout_s=30)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False
