"""How the load tests classify failures (loadtests/outcomes.py): by their shape."""

from __future__ import annotations

import sys

from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
import outcomes


def test_failures_are_classified_by_their_shape() -> None:
    shaped = {"error": {"message": "busy", "type": "server_error", "param": None, "code": "x"}}
    assert outcomes.http_refusal(503, shaped) == "refused"
    assert outcomes.http_refusal(429, shaped) == "refused"
    assert outcomes.http_refusal(400, shaped) == "improper"  # a valid request refused
    assert outcomes.http_refusal(500, "Internal Server Error") == "improper"
    assert outcomes.http_refusal(500, {"detail": "x"}) == "improper"
    failed = {"status": "failed", "error": {"code": "server_error", "message": "lost"}}
    assert outcomes.failed_properly(failed)
    assert not outcomes.failed_properly({"status": "failed", "error": None})
