"""Faults: an engine replica killed mid-stream ends the stream with response.failed, the
conversation moves to a live replica, and Ray Serve brings the replica back."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import ray

pytestmark = pytest.mark.faults
KEY = "fault-test-conversation"
MODEL = "gpt-oss-120b"


def engine_replica_actors() -> list[dict]:
    return [
        actor
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if "EngineDeployment" in actor["name"]
    ]


def events(lines) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ")]


def test_engine_replica_killed_mid_stream(app_url: str, engine_handle) -> None:
    replica = engine_handle.options(session_id=KEY).replica_id.remote().result(timeout_s=30)
    (victim,) = [actor for actor in engine_replica_actors() if replica in actor["name"]]
    body = {"model": MODEL, "input": "SDK-SLOW: take long", "stream": True, "prompt_cache_key": KEY}
    seen = []
    started = time.monotonic()
    with httpx.stream("POST", f"{app_url}/v1/responses", json=body, timeout=60) as response:
        for line in response.iter_lines():
            seen.append(line)
            if line.startswith("data:") and "response.reasoning_text.done" in line:
                ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]))
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
