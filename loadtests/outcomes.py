"""How the soaks classify what a client saw (loadtests/soak_store.py and the locust replay).

Every request ends one of four ways:

- ``acked``: the server acknowledged it (HTTP 200, or a stream's ``response.completed`` or
  ``response.incomplete``): if it was stored, it must be retrievable later, or it is *lost*;
- ``refused``: a proper refusal a client can act on: HTTP 429 or 5xx with a body in OpenAI's
  error shape, or a stream ending with ``response.failed`` whose ``error`` has a code and a
  message (a WebSocket ``error`` event with status 429 or 5xx counts too);
- ``hung``: a stream with no terminal event within the bound;
- ``improper``: anything else (a dropped connection, a stream cut short, a 4xx for a valid
  request, a 5xx that is not in OpenAI's shape).

Outcomes are written one JSON object a line, so a locust process can hand them to the soak.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ERROR_FIELDS = ("message", "type", "param", "code")


def openai_error(body: Any) -> bool:
    """A body in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    error = body.get("error") if isinstance(body, dict) else None
    return (
        isinstance(error, dict)
        and all(field in error for field in ERROR_FIELDS)
        and isinstance(error["message"], str)
        and isinstance(error["type"], str)
    )


def failed_properly(response: Any) -> bool:
    """A failed Response whose ``error`` says what went wrong (a code and a message)."""
    error = response.get("error") if isinstance(response, dict) else None
    return (
        isinstance(response, dict)
        and response.get("status") == "failed"
        and isinstance(error, dict)
        and isinstance(error.get("code"), str)
        and isinstance(error.get("message"), str)
    )


def http_refusal(status: int, body: Any) -> str:
    """``refused`` for a 429 or 5xx in OpenAI's shape, ``improper`` for anything else."""
    return "refused" if (status == 429 or status >= 500) and openai_error(body) else "improper"


def json_or_text(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content[:200].decode(errors="replace")


def error_code(body: Any) -> str | None:
    """The code of an OpenAI-shaped error body or of a failed Response, if any."""
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def record(path: str | Path | None, **outcome: Any) -> None:
    """Append one outcome (one line: a single write, whole even with several writers)."""
    if path:
        with open(path, "a") as file:
            file.write(json.dumps(outcome) + "\n")


def read(path: str | Path) -> list[dict[str, Any]]:
    file = Path(path)
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
