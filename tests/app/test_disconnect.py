"""A client that disconnects mid-stream aborts its engine request: also when the front changed
under the stream (an ingress replica replaced: HAProxy, under Ray's fast path, reloads, and the
process that holds the stream no longer reads from its client)."""

from __future__ import annotations

import httpx
import pytest
import ray

from serve_app.serving.http.keepalive import KEEPALIVE_S
from tests.support import AUTH, MODEL
from tests.support.helpers import wait_for
from tests.support.replicas import (
    engine_ongoing,
    replica_actor,
    replica_actors,
    wait_for_ingress_replicas,
)

KEY = "disconnect-test-conversation"


def _slow_turn(key: str) -> dict:
    return {
        "model": MODEL,
        "input": "SDK-SLOW: take your time",
        "stream": True,
        "prompt_cache_key": key,
    }


def test_disconnect_mid_stream_aborts_the_engine_request(app_url: str, app_cluster: None) -> None:
    running_mid_stream = None
    with httpx.stream(
        "POST", f"{app_url}/v1/responses", json=_slow_turn(KEY), headers=AUTH, timeout=30
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and "response.reasoning_text.done" in line:
                # The engine is now paused mid-turn. (Leaving this loop closes the connection.)
                running_mid_stream = engine_ongoing(KEY)
                break
    assert running_mid_stream is not None and running_mid_stream >= 1
    # The connection closed while the engine was still generating.
    assert wait_for(lambda: engine_ongoing(KEY) == 0), "the engine request was not aborted"


@pytest.mark.faults
def test_disconnect_after_the_front_changed_aborts_the_engine_request(
    app_url: str, app_cluster: None
) -> None:
    """Before the SSE keep-alive, under the fast path, the engine request ran on (until its end,
    or HAProxy's hard-stop-after, 120 s): the HAProxy process holding the stream never saw the
    client's FIN. The keep-alive's write makes it see the client gone."""
    key = "disconnect-after-reload"
    url = f"{app_url}/v1/responses"
    with httpx.stream("POST", url, json=_slow_turn(key), headers=AUTH, timeout=120) as response:
        serving = response.headers["x-serve-app-replica"]
        lines = response.iter_lines()  # one iterator: httpx streams a body once
        for line in lines:
            if line.startswith("data:") and "response.reasoning_text.done" in line:
                break
        assert engine_ongoing(key) == 1
        # Another ingress replica dies and Serve replaces it: the front's list of replicas
        # changes twice (HAProxy reloads twice under the fast path); this stream stays put.
        (other,) = [
            a for a in replica_actors("ResponsesIngress") if not a["name"].endswith(serving)
        ]
        ray.kill(replica_actor(other), no_restart=True)
        wait_for_ingress_replicas(app_url, 2)  # its replacement answers: the front knows it
        # Everything sent so far read: the client leaves with nothing unread (a close with
        # unread data would send a reset, which any front sees).
        for line in lines:
            if line.startswith(":"):  # a keep-alive after the change
                break
        assert engine_ongoing(key) == 1, "the engine request ended before the client left"
    aborted = wait_for(lambda: engine_ongoing(key) == 0, timeout_s=3 * KEEPALIVE_S)
    assert aborted, "the engine request ran on after its client left"
