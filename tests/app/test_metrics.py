"""serve_app's metrics on Ray's metrics export: one scrape of a node sees every replica on it.

Each node's Ray metrics agent (``ray.nodes()``' ``MetricsExportPort``) exports what every
process on the node records with ``ray.util.metrics`` (``serve_app.telemetry``), prefixed
``ray_`` and tagged by Ray Serve with the replica. The agent exports what the processes sent in
their last report (every ``RAY_metrics_report_interval_ms``, 10 s by default): the tests poll
with a deadline.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable

from openai import OpenAI
from prometheus_client.samples import Sample

from serve_app import telemetry
from tests.support import MODEL, ray_metrics
from tests.support.helpers import WEATHER_TOOL, scrape_metrics
from tests.support.replicas import replica_actors
from tests.support.websocket import connected, until_terminal

EXPORT_WAIT_S = 90  # a few of Ray's report intervals, on a loaded machine
PREFIX = "ray_serve_app_"


def export_until(done: Callable[[dict[str, list[Sample]]], bool]) -> dict[str, list[Sample]]:
    """The export, polled until ``done`` holds of it or `EXPORT_WAIT_S` passed (the last)."""
    deadline = time.monotonic() + EXPORT_WAIT_S
    while True:
        exported = ray_metrics.exported(PREFIX)
        if done(exported) or time.monotonic() > deadline:
            return exported
        time.sleep(2)


def replica_ids(deployment: str) -> set[str]:
    """The live replicas' ids, as Serve tags their metrics (``replica``): the actor name's
    last part (``SERVE_REPLICA::serve_app#Deployment#<id>``)."""
    return {actor["name"].rsplit("#", 1)[1] for actor in replica_actors(f"#{deployment}#")}


def tagged(exported: dict[str, list[Sample]], name: str, label: str, **where: str) -> set[str]:
    """The values of ``label`` on the samples of ``name`` whose labels include ``where``."""
    return {
        sample.labels.get(label, "")
        for sample in exported.get(name, [])
        if all(sample.labels.get(key) == value for key, value in where.items())
    }


def engine_replicas_served(app_url: str) -> set[str]:
    """The engine replicas the ingress replicas sent prompts to, by their own ``/metrics``."""
    pattern = r'^serve_app_engine_replica_prompt_tokens_total\{engine_replica="(\w+)"\}'
    pages = scrape_metrics(app_url).values()
    return {replica for page in pages for replica in re.findall(pattern, page, re.M)}


def turns_on_every_replica(client: OpenAI, app_url: str) -> None:
    """Two turns of each of several conversations (the second a prefix-cache hit), until both
    ingress replicas answered some and both engine replicas served some."""
    ingress, engines = replica_ids("ResponsesIngress"), replica_ids("EngineDeployment")
    answered: set[str] = set()
    for conversation in range(1, 41):
        key = str(uuid.uuid4())
        for _turn in range(2):
            raw = client.responses.with_raw_response.create(
                model=MODEL, input=f"Tell me about {key}", prompt_cache_key=key
            )
            answered.add(raw.headers["x-serve-app-replica"])
            assert raw.parse().status == "completed"
        # Every fourth conversation: a look at both ingress replicas' /metrics.
        if (
            conversation % 4 == 0
            and answered >= ingress
            and engine_replicas_served(app_url) >= engines
        ):
            return
    served = engine_replicas_served(app_url)
    raise AssertionError(f"ingress {answered} of {ingress}, engines {served} of {engines} served")


def test_every_ingress_and_engine_replica_is_on_the_nodes_metrics_export(
    client: OpenAI, app_url: str, app_cluster: None
) -> None:
    ingress, engines = replica_ids("ResponsesIngress"), replica_ids("EngineDeployment")
    assert len(ingress) == 2 and len(engines) == 2, (ingress, engines)
    turns_on_every_replica(client, app_url)

    def every_replica(exported: dict[str, list[Sample]]) -> bool:
        requests = tagged(exported, f"{PREFIX}requests_total", "replica", status="completed")
        decisions = tagged(exported, f"{PREFIX}routing_decisions_total", "replica")
        engine_side = tagged(exported, f"{PREFIX}engine_requests_total", "replica")
        routers_view = tagged(
            exported, f"{PREFIX}engine_replica_ongoing_requests", "engine_replica"
        )
        return (
            ingress <= requests
            and ingress <= decisions
            and engines <= engine_side
            and engines <= routers_view
        )

    exported = export_until(every_replica)
    # Each ingress replica's requests and its router's decisions, tagged with it.
    assert ingress <= tagged(
        exported, f"{PREFIX}requests_total", "replica", deployment="ResponsesIngress"
    ), exported.get(f"{PREFIX}requests_total")
    assert ingress <= tagged(
        exported, f"{PREFIX}routing_decisions_total", "replica", deployment="ResponsesIngress"
    ), exported.get(f"{PREFIX}routing_decisions_total")
    # Each engine replica's own count, tagged with it; and the routers' view of each.
    assert engines <= tagged(
        exported, f"{PREFIX}engine_requests_total", "replica", deployment="EngineDeployment"
    ), exported.get(f"{PREFIX}engine_requests_total")
    assert engines <= tagged(
        exported, f"{PREFIX}engine_replica_ongoing_requests", "engine_replica"
    ), exported.get(f"{PREFIX}engine_replica_ongoing_requests")


# The scripted model calls a tool no request declares (tests/fixtures/engine_script.yaml).
UNKNOWN_TOOL_TASK = "UNKNOWN-TOOL-TASK: where is the tool loop?"


def test_every_metric_the_dashboard_queries_is_exported(
    client: OpenAI, app_url: str, app_cluster: None
) -> None:
    wanted = ray_metrics.dashboard_names(PREFIX)
    assert len(wanted) >= 15, wanted
    # Traffic that moves every panel: turns and their prefix-cache hits, a WebSocket
    # response, a compaction.
    turns_on_every_replica(client, app_url)
    with connected(client) as connection:
        connection.response.create(model=MODEL, input="Hello over a socket")
        assert until_terminal(connection)[-1].type == "response.completed"
    history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]
    compacted = client.responses.compact(model=MODEL, input=history)
    assert compacted.output[-1].type == "compaction"
    # The model calls a tool the request lacks (the server answers it); a web_search with no
    # browser tool server is served without.
    unknown = client.responses.create(model=MODEL, input=UNKNOWN_TOOL_TASK, tools=[WEATHER_TOOL])
    assert unknown.status == "completed"
    searched = client.responses.create(model=MODEL, input="Hi", tools=[{"type": "web_search"}])
    assert searched.status == "completed"

    exported = export_until(lambda exported: wanted <= exported.keys())
    assert wanted <= exported.keys(), sorted(wanted - exported.keys())


def test_a_removed_label_set_leaves_the_export(app_cluster: None) -> None:
    """A gauge's label set that is gone (an engine replica the router no longer sees) leaves
    Ray's export within a few report intervals, while the one still set stays: this process is
    joined to the cluster, so its metrics are exported by this node's agent too."""
    gauge = telemetry.Gauge(
        f"serve_app_test_stale_{uuid.uuid4().hex[:8]}", "A test's gauge.", ["engine_replica"]
    )
    name = "ray_" + gauge.name
    gauge.set_all({("kept",): 1, ("gone",): 2})

    def replicas(exported: dict[str, list[Sample]]) -> set[str]:
        return tagged(exported, name, "engine_replica")

    both = export_until(lambda exported: replicas(exported) >= {"kept", "gone"})
    assert replicas(both) == {"kept", "gone"}, both.get(name)

    gauge.set_all({("kept",): 3})
    after = export_until(lambda exported: replicas(exported) == {"kept"})
    assert replicas(after) == {"kept"}, after.get(name)
    (kept,) = after[name]
    assert kept.value == 3
