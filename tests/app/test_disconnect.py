"""A client that disconnects mid-stream aborts its engine request."""

from __future__ import annotations

import httpx

from tests.support import MODEL
from tests.support.helpers import wait_for
from tests.support.replicas import engine_ongoing

KEY = "disconnect-test-conversation"


def test_disconnect_mid_stream_aborts_the_engine_request(app_url: str, app_cluster: None) -> None:
    body = {
        "model": MODEL,
        "input": "SDK-SLOW: take your time",
        "stream": True,
        "prompt_cache_key": KEY,
    }
    running_mid_stream = None
    with httpx.stream("POST", f"{app_url}/v1/responses", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and "response.reasoning_text.done" in line:
                # The engine is now paused mid-turn. (Leaving this loop closes the connection.)
                running_mid_stream = engine_ongoing(KEY)
                break
    assert running_mid_stream is not None and running_mid_stream >= 1
    # The connection closed while the engine was still generating.
    assert wait_for(lambda: engine_ongoing(KEY) == 0), "the engine request was not aborted"
