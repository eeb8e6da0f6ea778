"""What the Ray cluster's metrics export holds, and what the Grafana dashboard asks of it.

Each node's Ray metrics agent (``ray.nodes()``' ``MetricsExportPort``) exports what the
processes on the node record with Ray's metrics API, prefixed ``ray_``: serve_app's own
(``ray_serve_app_``, tests/app/test_metrics.py) and vLLM's (``ray_vllm_``,
tests/vllm_cpu/test_vllm_metrics.py). For tests joined to the app's cluster (``app_cluster``).
"""

from __future__ import annotations

import json
import re

import httpx
import ray
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support import REPO


def exported(prefix: str) -> dict[str, list[Sample]]:
    """Every sample whose name starts with ``prefix`` on the live nodes' export, by name."""
    samples: dict[str, list[Sample]] = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
            for sample in family.samples:
                if sample.name.startswith(prefix):
                    samples.setdefault(sample.name, []).append(sample)
    return samples


def dashboard_names(prefix: str) -> set[str]:
    """The metric names starting with ``prefix`` that k8s/grafana-dashboard.json's panels query."""
    dashboard = json.loads((REPO / "k8s" / "grafana-dashboard.json").read_text())
    return {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(rf"\b{re.escape(prefix)}[a-z0-9_]+", target["expr"])
    }
