"""A worker node lost under load (issue 47), on the cluster's two worker nodes (three Ray nodes
with the head) and PostgreSQL.

The engine's three replicas are on both worker nodes (as tests/cluster/test_upgrade.py leaves
them; arranged so otherwise). The locust replay runs (``USERS`` users, half of the sessions
stored and chained by ``previous_response_id``), and long streams (the scripted 12-second turn),
each its own conversation, are in flight on both worker nodes; then the worker node with the
most of them is lost: every process of it killed at once (``remove_node`` without grace: a
machine that dies). Its replicas' streams cannot finish anywhere.

- Its in-flight streams end with a proper error (``response.failed`` with a code, or a 429/5xx
  in OpenAI's shape: loadtests/outcomes.py), never hung or cut; the long streams on the other
  node complete.
- Its replicas come back on the other worker node; the time from the loss to each step is
  printed (the streams failed, the node declared dead, the replicas back, the last failed turn).
- No turn fails once they are back, and none hangs at any time; in the end no request is left
  in flight on an ingress replica.
- No acknowledged write is lost: each stored response the replay was told was done is fetched
  again (loadtests/soak_store.py's check).
- Sealed blobs and conversations keep working: a reasoning item sealed before the loss is
  opened by every ingress replica after it, and a conversation and a ``previous_response_id``
  chain begun before it go on.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

from tests.support import API_KEY, API_KEY_ENV, AUTH, MODEL, REPO
from tests.support.cluster import (
    ENGINE,
    ENGINE_SLOTS,
    ClusterApp,
    Sampler,
    engine_sample,
    holding_slots,
)
from tests.support.replicas import engine_replica_serving
from tests.support.weather_history import TOOLS

sys.path.insert(0, str(REPO / "loadtests"))
import outcomes
import scaling
import soak_store
import timeline

pytestmark = pytest.mark.faults

USERS = 6
ENGINE_REPLICAS = 3
LONG_STREAMS = 4  # long streams at least; more until both worker nodes serve some
MAX_LONG_STREAMS = 10
WARM_TURNS = 12  # turns acknowledged before the node is lost
AFTER_S = 12.0  # of load once the replicas are back
RECOVERY_TIMEOUT_S = 180.0
OPEN_ROUND = 8  # requests at once opening the sealed item, in each round


class LongStream(threading.Thread):
    """One streamed scripted long turn (CLUSTER-LONG: reasoning, 12 s of nothing, text), its
    events with when each came, and how it ended."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(name=f"stream {key}", daemon=True)
        self.url, self.key = url, key
        self.started = threading.Event()
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.error: str | None = None
        self.ended_at: float | None = None

    def run(self) -> None:
        body = {"model": MODEL, "input": "CLUSTER-LONG: stream", "stream": True}
        body["prompt_cache_key"] = self.key
        try:
            with httpx.stream(
                "POST", f"{self.url}/v1/responses", json=body, headers=AUTH, timeout=90
            ) as answer:
                if answer.status_code != 200:
                    self.error = f"HTTP {answer.status_code}: {answer.read()[:300]!r}"
                    return
                for line in answer.iter_lines():
                    if line.startswith("data: "):
                        self.events.append((time.time(), json.loads(line[6:])))
                        if self.events[-1][1]["type"].endswith(".delta"):
                            self.started.set()
        except httpx.HTTPError as error:
            self.error = repr(error)
        finally:
            self.ended_at = time.time()
            self.started.set()

    @property
    def last(self) -> dict[str, Any] | None:
        return self.events[-1][1] if self.events else None

    def outcome(self) -> str:
        """loadtests/outcomes.py's classes: acked, refused (properly), improper; hung if open."""
        if self.is_alive():
            return "hung"
        last = self.last
        if last is None or self.error:
            return "improper"
        if last["type"] in ("response.completed", "response.incomplete"):
            return "acked"
        if last["type"] == "response.failed" and outcomes.failed_properly(last["response"]):
            return "refused"
        return "improper"


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    # A client per request: a new connection each time, so both ingress replicas answer.
    with httpx.Client(headers=AUTH, timeout=60) as client:
        return client.post(url, json=body)


def spread_engine(cluster: ClusterApp) -> None:
    """Three engine replicas on two worker nodes (unless already so)."""
    if len(cluster.workers) < 2:
        cluster.add_worker()
    nodes = cluster.engine_nodes()
    if len(nodes) >= 2 and sum(nodes.values()) == ENGINE_REPLICAS:
        return
    cluster.set_engine(num_replicas=2)
    nodes = cluster.engine_nodes()
    (full,) = [node for node in cluster.workers if node.node_id in nodes][:1]
    with holding_slots(full.node_id, ENGINE_SLOTS - nodes[full.node_id]):
        cluster.set_engine(num_replicas=ENGINE_REPLICAS)
    assert len(cluster.engine_nodes()) == 2, cluster.engine_nodes()


def test_a_worker_node_lost_under_load(
    cluster: ClusterApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_KEY_ENV, API_KEY)
    spread_engine(cluster)
    nodes = cluster.engine_nodes()
    node_of = {replica.name: replica.node for replica in cluster.replicas(ENGINE)}

    # Before: a sealed reasoning item, a conversation and a chain, each with a turn.
    sealed_body = {
        "model": MODEL,
        "input": [{"role": "user", "content": "SDK-TOOL: weather in Paris?"}],
        "tools": TOOLS,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    answer = post(f"{cluster.url}/v1/responses", sealed_body)
    assert answer.status_code == 200, answer.text
    reasoning, call = answer.json()["output"]
    conversation = post(f"{cluster.url}/v1/conversations", {}).json()["id"]
    first = post(
        f"{cluster.url}/v1/responses",
        {"model": MODEL, "input": "SDK-TEXT: before", "conversation": conversation},
    )
    assert first.status_code == 200, first.text
    chained = post(f"{cluster.url}/v1/responses", {"model": MODEL, "input": "SDK-TEXT: chain"})
    assert chained.status_code == 200, chained.text

    replay = scaling.Replay(
        cluster.url, tmp_path, "node-loss", shape=f"900:{USERS}", store_share=0.5
    ).start()
    streams: list[LongStream] = []
    try:
        with Sampler(engine_sample) as sampler:
            scaling.wait_until(
                lambda: len(timeline.acked(replay.turns())) >= WARM_TURNS,
                120,
                f"fewer than {WARM_TURNS} turns before the loss: {replay.log_tail()}",
            )
            # Long streams, each its own conversation, until both worker nodes serve some.
            homes: dict[str, str | None] = {}  # stream: the node of its engine replica
            while len(streams) < MAX_LONG_STREAMS and (
                len(streams) < LONG_STREAMS or len(set(homes.values()) - {None}) < 2
            ):
                streams.append(LongStream(cluster.url, f"long-{len(streams)}-{time.time()}"))
                streams[-1].start()
                assert streams[-1].started.wait(60), f"{streams[-1].key} never started"
                home = engine_replica_serving(streams[-1].key) or {}
                homes[streams[-1].key] = node_of.get(home.get("name"))
            on_node = Counter(homes.values())
            victim = max(cluster.workers, key=lambda node: on_node.get(node.node_id, 0))
            survivor = next(node for node in cluster.workers if node is not victim)
            lost = {name for name, node in node_of.items() if node == victim.node_id}
            on_victim = [stream for stream in streams if homes[stream.key] == victim.node_id]
            on_survivor = [stream for stream in streams if homes[stream.key] == survivor.node_id]
            print(
                f"engine replicas by node: {nodes}; long streams by node: {dict(on_node)}; "
                f"losing {victim.node_id[:8]} with {len(lost)} replicas"
            )
            assert on_victim and on_survivor, on_node
            assert all(stream.is_alive() for stream in streams), "a long stream ended early"
            # The count the end waits to see at zero counts each stream in flight here.
            in_flight = ongoing_requests(cluster)
            assert sum(in_flight.values()) >= len(streams), in_flight

            removed = time.time()
            cluster.remove_worker(victim)
            node_dead = replicas_back = None
            deadline = time.monotonic() + RECOVERY_TIMEOUT_S
            while node_dead is None or replicas_back is None:
                assert time.monotonic() < deadline, (node_dead, replicas_back, sampler.samples[-3:])
                if node_dead is None and not any(
                    node["Alive"] for node in ray.nodes() if node["NodeID"] == victim.node_id
                ):
                    node_dead = time.time() - removed
                alive = cluster.replicas(ENGINE)
                if (
                    replicas_back is None
                    and len(alive) == ENGINE_REPLICAS
                    and all(r.node == survivor.node_id for r in alive)
                    and cluster.replica_states(ENGINE) == {"RUNNING": ENGINE_REPLICAS}
                ):
                    replicas_back = time.time() - removed
                time.sleep(0.5)
            for stream in streams:
                stream.join(60)
            time.sleep(AFTER_S)
            replay.stop()
            turns = replay.wait(timeout_s=scaling.TURN_TIMEOUT_S + 60)
    finally:
        replay.stop()

    # The streams on the lost node failed properly, promptly; the others completed.
    failed_after = [round(stream.ended_at - removed, 1) for stream in on_victim]
    for stream in streams:
        expected = "refused" if stream in on_victim else "acked"
        assert stream.outcome() == expected, (stream.key, stream.error, stream.last)
    failed_turns = scaling.failures(turns)
    back_at = removed + replicas_back
    stored = [
        soak_store.Outcome("turn", "acked", response_id=turn["id"])
        for turn in turns
        if turn["outcome"] == "acked" and turn["id"]
    ]
    verdicts = asyncio.run(soak_store.check(cluster.url, stored))
    figures = {
        "turns": len(turns),
        "failed_turns": len(failed_turns),
        "failed_by_code": count_codes(failed_turns),
        "long_streams_on_lost_node": len(on_victim),
        "long_streams_on_other_node": len(on_survivor),
        "long_streams_failed_after_s": failed_after,
        "node_declared_dead_after_s": round(node_dead, 1),
        "replicas_back_after_s": round(replicas_back, 1),
        "last_failed_turn_after_s": round(
            max((t["at"] for t in failed_turns), default=removed) - removed, 1
        ),
        "stored_acknowledged": len(stored),
        "stored_kept": sum(1 for verdict in verdicts.values() if verdict == "kept"),
        "hit_rate_before": timeline.hit_rate([t for t in turns if t["started_at"] < removed]),
        "hit_rate_after": timeline.hit_rate([t for t in turns if t["started_at"] >= back_at]),
    }
    print(json.dumps(figures))
    assert not replay.errors(), replay.errors()[:5]
    assert all(turn["outcome"] == "refused" for turn in failed_turns), [
        (turn["outcome"], turn["detail"]) for turn in failed_turns
    ]
    assert all(turn["started_at"] < back_at for turn in failed_turns), failed_turns
    assert len([t for t in turns if t["started_at"] >= back_at]) >= 10

    # Every acknowledged stored write is kept.
    assert len(stored) >= 10, f"only {len(stored)} stored turns acknowledged"
    assert set(verdicts.values()) == {"kept"}, verdicts

    # Sealed reasoning opens on every ingress replica; the conversation and the chain go on.
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    call = {key: call[key] for key in ("type", "call_id", "name", "arguments")}
    question = sealed_body["input"][0]
    text = [{"type": "reasoning_text", "text": "I need the weather tool."}]
    counts = {
        name: post(
            f"{cluster.url}/v1/responses/input_tokens",
            {"model": MODEL, "input": [question, *reasoning_item, call, result], "tools": TOOLS},
        )
        for name, reasoning_item in (
            ("dropped", []),
            ("rendered", [{"type": "reasoning", "summary": [], "content": text}]),
        )
    }
    sealed_item = {
        "type": "reasoning",
        "summary": [],
        "encrypted_content": reasoning["encrypted_content"],
    }
    ingress = {
        name.rsplit("#", 1)[-1] for name in (r.name for r in cluster.replicas("ResponsesIngress"))
    }
    # In concurrent rounds until every ingress replica has opened it: Serve's proxy sends each
    # request to the replica it counts fewer requests on, and its count of one can stay a
    # request too high for its cache's 10 s after load (one request at a time then all went to
    # the other, 40 in a row); requests in flight together spread whatever it counts.
    body = {"model": MODEL, "input": [question, sealed_item, call, result], "tools": TOOLS}
    opened: list[httpx.Response] = []
    with ThreadPoolExecutor(OPEN_ROUND) as pool:
        while len(opened) < 5 * OPEN_ROUND and answered_by(opened) != ingress:
            round_ = [f"{cluster.url}/v1/responses/input_tokens"] * OPEN_ROUND
            opened += pool.map(lambda url: post(url, body), round_)
    assert answered_by(opened) == ingress, (answered_by(opened), ongoing_requests(cluster))
    rendered = counts["rendered"].json()["input_tokens"]
    assert rendered > counts["dropped"].json()["input_tokens"]
    assert [answer.json()["input_tokens"] for answer in opened] == [rendered] * len(opened)

    again = post(
        f"{cluster.url}/v1/responses",
        {"model": MODEL, "input": "SDK-TEXT: after", "conversation": conversation},
    )
    assert again.status_code == 200 and again.json()["status"] == "completed", again.text
    items = httpx.get(
        f"{cluster.url}/v1/conversations/{conversation}/items", headers=AUTH, timeout=30
    ).json()["data"]
    texts = json.dumps(items)
    assert "SDK-TEXT: before" in texts and "SDK-TEXT: after" in texts
    follow = post(
        f"{cluster.url}/v1/responses",
        {"model": MODEL, "input": "SDK-TEXT: more", "previous_response_id": chained.json()["id"]},
    )
    assert follow.status_code == 200 and follow.json()["status"] == "completed", follow.text

    # Nothing is left in flight on an ingress replica: no request waits on the lost replicas.
    left, deadline = ongoing_requests(cluster), time.monotonic() + 30
    while set(left.values()) != {0} and time.monotonic() < deadline:
        time.sleep(1)
        left = ongoing_requests(cluster)
    assert set(left.values()) == {0}, left


def count_codes(turns: list[dict[str, Any]]) -> dict[str, int]:
    codes: dict[str, int] = {}
    for turn in turns:
        codes[turn["detail"]] = codes.get(turn["detail"], 0) + 1
    return codes


def ongoing_requests(cluster: ClusterApp) -> dict[str, int]:
    """Each ingress replica's ongoing requests, by its own count (what Serve's proxy asks it
    when it has no fresh count of its own)."""
    found = {}
    for replica in cluster.replicas("ResponsesIngress"):
        actor = ray.get_actor(replica.name, namespace="serve")
        found[replica.name] = ray.get(actor.get_num_ongoing_requests.remote(), timeout=30)
    return found


def answered_by(answers: list[httpx.Response]) -> set[str]:
    return {answer.headers["x-serve-app-replica"] for answer in answers}
