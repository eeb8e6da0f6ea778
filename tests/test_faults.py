"""Faults: an engine replica killed mid-stream ends the stream with response.failed, the
conversation moves to a live replica, and Ray Serve brings the replica back."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import ray

from tests.replicas import engine_replica_actors, engine_replica_serving, replica_actor

pytestmark = pytest.mark.faults
KEY = "fault-test-conversation"
MODEL = "gpt-oss-120b"


def events(lines) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ")]


def test_engine_replica_killed_mid_stream(app_url: str, app_cluster: None) -> None:
    victim: dict | None = None
    body = {"model": MODEL, "input": "SDK-SLOW: take long", "stream": True, "prompt_cache_key": KEY}
    seen = []
    started = time.monotonic()
    with httpx.stream("POST", f"{app_url}/v1/responses", json=body, timeout=60) as response:
        for line in response.iter_lines():
            seen.append(line)
            if line.startswith("data:") and "response.reasoning_text.done" in line:
                victim = engine_replica_serving(KEY)
                assert victim is not None, "no engine replica reports serving the stream"
                ray.kill(replica_actor(victim))
    assert victim is not None, "the stream ended before its reasoning did"
    stream = events(seen)
    assert stream[-1]["type"] == "response.failed", [event["type"] for event in stream]
    assert isinstance(stream[-1]["response"]["error"]["code"], str)
    assert time.monotonic() - started < 30  # failed promptly, not after the engine's 60 s pause

    # The same conversation is served at once by a live replica.
    retry = {"model": MODEL, "input": "SDK-TEXT: again", "prompt_cache_key": KEY}
    answer = httpx.post(f"{app_url}/v1/responses", json=retry, timeout=60).json()
    assert answer["status"] == "completed", answer

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # Serve replaces the dead replica
        alive = engine_replica_actors()
        if len(alive) == 2 and victim["name"] not in {actor["name"] for actor in alive}:
            break
        time.sleep(1)
    else:
        pytest.fail("the killed engine replica was not replaced")
