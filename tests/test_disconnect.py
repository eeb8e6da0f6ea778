"""A client that disconnects mid-stream aborts its engine request."""

from __future__ import annotations

import httpx

from tests.helpers import engine_ongoing, wait_for

KEY = "disconnect-test-conversation"


def ongoing(handle) -> int:
    return engine_ongoing(handle, KEY)


def test_disconnect_mid_stream_aborts_the_engine_request(app_url: str, engine_handle) -> None:
    assert wait_for(lambda: ongoing(engine_handle) == 0)
    body = {
        "model": "gpt-oss-120b",
        "input": "SDK-SLOW: take your time",
        "stream": True,
        "prompt_cache_key": KEY,
    }
    running_mid_stream = None
    with httpx.stream("POST", f"{app_url}/v1/responses", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and "response.reasoning_text.done" in line:
                # The engine is now paused mid-turn. (Leaving this loop closes the connection.)
                running_mid_stream = ongoing(engine_handle)
                break
    assert running_mid_stream == 1
    # The connection closed while the engine was still generating.
    assert wait_for(lambda: ongoing(engine_handle) == 0), "the engine request was not aborted"
