"""The watchdog's question to Ray, against the session app's cluster
(serve_app.serving.engine.liveness, `replicas_gone` in serve_app/serving/engine/client.py): the
engine replicas, by the ids their chunks carry, are alive; an id of no replica is gone; a replica
killed is gone within a second of the kill (a silent stream of it then fails within 2 s,
whatever the transport), so only a live replica's silence is given the longer bound."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from serve_app.serving.engine.client import replicas_gone
from tests.support.replicas import (
    call_deployment,
    engine_replica_actors,
    replica_actor,
    replica_started,
)

pytestmark = pytest.mark.faults


def test_ray_confirms_a_killed_engine_replica_gone_within_a_second(app_cluster: None) -> None:
    actors = engine_replica_actors()
    ids = {call_deployment(actor, "replica_id"): actor for actor in actors}
    assert len(ids) == 2, ids
    assert asyncio.run(replicas_gone({*ids, "no-such-replica"})) == {"no-such-replica"}

    victim_id, victim = next(iter(ids.items()))
    ray.kill(replica_actor(victim))
    killed = time.monotonic()
    # What the watchdog relies on: a question asked a second or more after the kill is answered
    # "gone". So it is judged by when each question was asked, not by when its answer came: on
    # a loaded machine one answer can take most of a second (a wall-clock bound on the answers
    # failed so, once, in issue 39's runs), and that is the watchdog's wait, bounded apart.
    last_listed_at = killed
    while True:
        asked = time.monotonic()
        if victim_id in asyncio.run(replicas_gone(set(ids))):
            break
        last_listed_at = asked
        assert asked - killed < 30, "the killed replica still listed after 30 s"
        time.sleep(0.02)
    print(
        f"the killed engine replica: last listed by a question asked {last_listed_at - killed:.2f}"
        f" s after the kill, listed gone at {time.monotonic() - killed:.2f} s"
    )
    assert last_listed_at - killed < 1.0, "listed alive by a question asked over 1 s after"
    assert asyncio.run(replicas_gone(set(ids))) == {victim_id}  # the other is alive

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # Serve replaces it (the next tests need two)
        alive = engine_replica_actors()
        if len(alive) == 2 and all(replica_started(actor) for actor in alive):
            break
        time.sleep(1)
    else:
        pytest.fail("the killed engine replica was not replaced")
