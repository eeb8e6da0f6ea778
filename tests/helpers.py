"""Shared test helpers: Codex capture fixtures and harmony decoding."""

from __future__ import annotations

import json
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
