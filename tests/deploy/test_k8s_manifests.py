"""The KubeRay manifests validate offline: CRD schema (unknown fields rejected), Ray's own Serve
config schema, and the embedded Serve config is configs/gpt-oss.yaml with
k8s/serve_overrides.yaml merged in (tests/deploy/test_deployment.py checks what it deploys fits)."""

from __future__ import annotations

import copy
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from serve_app.config import MCP_ALLOW_ENV, AppArgs, ToolArgs
from serve_app.serving.tools.builtin import tool_server_client
from serve_app.serving.tools.mcp import McpClient, UnsafeAddress
from tests.support.helpers import REPO

# KubeRay's RayService CRD (ray.io/v1): its openAPIV3Schema as JSON Schema (Apache-2.0).
SCHEMA = REPO / "tests" / "fixtures" / "k8s" / "rayservice_v1.schema.json"
RAYSERVICE = REPO / "k8s" / "rayservice.yaml"
CHECK_JSONSCHEMA = str(Path(sys.executable).parent / "check-jsonschema")


def strict(schema: Any) -> Any:
    """The CRD schema with unknown fields rejected wherever Kubernetes would prune them."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


@pytest.fixture(scope="module")
def strict_schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("schema") / "rayservice.strict.json"
    path.write_text(json.dumps(strict(json.loads(SCHEMA.read_text()))))
    return path


def check(schema: Path, document: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHECK_JSONSCHEMA, "--schemafile", str(schema), str(document)],
        capture_output=True,
        text=True,
    )


def test_rayservice_matches_the_crd_schema(strict_schema: Path) -> None:
    result = check(strict_schema, RAYSERVICE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_strict_schema_rejects_an_unknown_field(strict_schema: Path, tmp_path: Path) -> None:
    manifest = yaml.safe_load(RAYSERVICE.read_text())
    broken = copy.deepcopy(manifest)
    broken["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParamz"] = {}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert check(strict_schema, path).returncode != 0


def render_module():
    sys.path.insert(0, str(REPO / "k8s"))
    try:
        import render
    finally:
        sys.path.pop(0)
    return render


def test_embedded_serve_config_is_valid_and_is_configs_gpt_oss_with_the_overrides() -> None:
    manifest = yaml.safe_load(RAYSERVICE.read_text())
    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve_config)  # Ray's own schema for `serve deploy`
    (app,) = serve_config["applications"]
    AppArgs.model_validate(app["args"])  # the app's own (unknown fields rejected)
    base = yaml.safe_load((REPO / "configs" / "gpt-oss.yaml").read_text())
    assert serve_config == render_module().serve_config()
    # Everything but what k8s/serve_overrides.yaml names is configs/gpt-oss.yaml's.
    (base_app,) = base["applications"]
    assert {k: v for k, v in app.items() if k not in ("args", "deployments")} == {
        k: v for k, v in base_app.items() if k not in ("args", "deployments")
    }
    assert app["args"]["engine"]["options"]["model"] == "/models/gpt-oss-120b"


def test_the_overrides_cannot_name_what_the_config_lacks() -> None:
    render = render_module()
    with pytest.raises(ValueError, match="EngineDeploymnt"):
        render.merge(
            {"deployments": [{"name": "EngineDeployment", "num_replicas": 1}]},
            {"deployments": [{"name": "EngineDeploymnt", "num_replicas": 2}]},
        )
    merged = render.merge(
        {"deployments": [{"name": "A", "x": {"y": 1, "z": 2}}, {"name": "B"}]},
        {"deployments": [{"name": "A", "x": {"z": 3}}]},
    )
    assert merged == {"deployments": [{"name": "A", "x": {"y": 1, "z": 3}}, {"name": "B"}]}


def test_rayservice_yaml_is_rendered_from_the_current_config() -> None:
    assert RAYSERVICE.read_text() == render_module().render(), "run: python k8s/render.py"


def test_gpu_workers_and_a_gpu_free_head() -> None:
    spec = yaml.safe_load(RAYSERVICE.read_text())["spec"]["rayClusterConfig"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    (worker,) = spec["workerGroupSpecs"]
    limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) >= 2
    (ingress,) = yaml.safe_load_all((REPO / "k8s" / "ingress.yaml").read_text())
    assert ingress["kind"] == "Ingress"


def test_dashboard_queries_only_metrics_the_app_exports() -> None:
    """Every ``ray_serve_app_`` name in the dashboard's queries is one the app's metrics show on
    Ray's metrics export (the running app's export: tests/app/test_metrics.py)."""

    from serve_app import telemetry
    from serve_app.routing import metrics as routing_metrics
    from serve_app.serving import metrics as serving_metrics

    exported = telemetry.exported_names(
        value
        for module in (routing_metrics, serving_metrics)
        for value in vars(module).values()
        if isinstance(value, telemetry.Metric)
    )
    dashboard = json.loads((REPO / "k8s" / "grafana-dashboard.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queried = {name for expr in queries for name in re.findall(r"\bray_serve_app_\w+", expr)}
    assert len(queried) >= 15 and queried <= exported, queried - exported
    # Nothing left of the names before Ray's export (serve_app:..., read from /metrics).
    assert not [expr for expr in queries if re.search(r"(?<!ray_)\bserve_app[:_]", expr)]


def test_every_ray_container_has_the_fast_path_env_of_configs_fast_path_env() -> None:
    from serve_app.fast_path import read_env_file

    wanted = read_env_file()
    assert wanted["RAY_SERVE_ENABLE_HA_PROXY"] == "1", wanted
    spec = yaml.safe_load(RAYSERVICE.read_text())["spec"]["rayClusterConfig"]
    pods = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    containers = [c for pod in pods for c in pod["template"]["spec"]["containers"]]
    assert len(containers) == 2
    for container in containers:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {name: env.get(name) for name in wanted} == wanted, container["name"]


def _matches(selector: dict, labels: dict[str, str]) -> bool:
    """Kubernetes' label selector (matchLabels, matchExpressions with In) on ``labels``."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_prometheus_scrapes_every_ray_pods_metrics_port_not_the_service() -> None:
    """Ray's metrics agent on each node exports every replica's metrics there (serve_app's
    included: tests/app/test_metrics.py): Prometheus reads each Ray pod's metrics-export-port,
    by the PodMonitor and by the pods' scrape annotations; the Service and Ingress carry no
    metrics (one replica's, at random)."""
    (monitor,) = yaml.safe_load_all((REPO / "k8s" / "podmonitor.yaml").read_text())
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    spec = yaml.safe_load(RAYSERVICE.read_text())["spec"]["rayClusterConfig"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for group in groups:
        template = group["template"]
        port = group["rayStartParams"]["metrics-export-port"]
        assert _matches(monitor["spec"]["selector"], template["metadata"]["labels"])
        (container,) = template["spec"]["containers"]
        named = {p["name"]: str(p["containerPort"]) for p in container["ports"]}
        assert named[endpoint["port"]] == port, (named, port)
        annotations = template["metadata"]["annotations"]
        assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": port}
    # Not PostgreSQL's pods (they have no metrics port).
    for doc in yaml.safe_load_all((REPO / "k8s" / "postgres.yaml").read_text()):
        labels = doc.get("spec", {}).get("template", {}).get("metadata", {}).get("labels")
        if labels:
            assert not _matches(monitor["spec"]["selector"], labels)
    ingress = list(yaml.safe_load_all((REPO / "k8s" / "ingress.yaml").read_text()))
    assert "/metrics" not in json.dumps(ingress)


def _ray_containers(manifest: dict) -> list[dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [container for pod in pods for container in pod["template"]["spec"]["containers"]]


def _secret_keys_created_by_the_readme() -> set[str]:
    """The keys of the `serve-app` Secret that k8s/README.md's `kubectl create secret` makes."""
    readme = (REPO / "k8s" / "README.md").read_text()
    command = re.search(r"kubectl create secret generic serve-app((?:[^\n]*\\\n)*[^\n]*)", readme)
    assert command, "k8s/README.md no longer creates the serve-app Secret"
    return set(re.findall(r"--from-literal=([a-z0-9-]+)=", command.group(1)))


def api_key_sources(manifest: dict) -> list[str | None]:
    """Per Ray container, the Secret key its API keys come from (None: the app gets none).
    `SERVE_APP_API_KEYS` or `SERVE_APP_API_KEYS_FILE` from the serve-app Secret, or keys in the
    embedded Serve config's args (a secret in a manifest: not how this one does it)."""
    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    (app,) = serve_config["applications"]
    secrets = app["args"].get("secrets", {})
    in_config = "args" if secrets.get("api_keys") or secrets.get("api_keys_file") else None
    sources = []
    for container in _ray_containers(manifest):
        named = {entry["name"]: entry for entry in container.get("env", [])}
        entry = named.get("SERVE_APP_API_KEYS") or named.get("SERVE_APP_API_KEYS_FILE")
        ref = (entry or {}).get("valueFrom", {}).get("secretKeyRef", {})
        sources.append(ref.get("key") if ref.get("name") == "serve-app" else in_config)
    return sources


def api_access_on_the_cluster(manifest: dict) -> str:
    """What the app decides at start-up on the cluster the manifest makes (Serve's host from its
    config, two or more nodes): `OpenApiRefused` when it gets no keys."""
    from serve_app.serving.http.exposure import Exposure, api_access

    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    (app,) = serve_config["applications"]
    has_keys = all(source is not None for source in api_key_sources(manifest))
    host = serve_config.get("http_options", {}).get("host")
    allow_open = AppArgs.model_validate(app["args"]).allow_open_api
    return api_access(has_keys, Exposure(host, nodes=2), allow_open)


def test_the_rayservice_gives_every_ray_container_the_api_keys_of_the_secret() -> None:
    """Closed by default on the cluster: the keys come from the Secret the README creates, and
    the app's own start-up decision, on what the manifest sets, is a closed API."""
    manifest = yaml.safe_load(RAYSERVICE.read_text())
    sources = api_key_sources(manifest)
    assert sources and all(source is not None for source in sources), sources
    assert set(sources) <= _secret_keys_created_by_the_readme()
    assert api_access_on_the_cluster(manifest) == "closed"


def test_a_rayservice_without_keys_would_not_start() -> None:
    from serve_app.serving.http.exposure import OpenApiRefused

    manifest = yaml.safe_load(RAYSERVICE.read_text())
    for container in _ray_containers(manifest):
        container["env"] = [
            e for e in container["env"] if not e["name"].startswith("SERVE_APP_API")
        ]
    assert None in api_key_sources(manifest)
    with pytest.raises(OpenApiRefused):
        api_access_on_the_cluster(manifest)


# k8s/README.md's way to name the cluster's tool servers: `tools: {browser_server_url: URL,
# python_server_url: URL}` under the app's args in serve_overrides.yaml.
DOCUMENTED_TOOLS = re.compile(
    r"`tools: \{browser_server_url: (?P<browser>\S+), python_server_url: (?P<python>\S+)\}`"
)


def _tools_overlay(path: Path) -> Path:
    """The overrides k8s/README.md tells an operator to add, as a file render.py merges."""
    readme = " ".join((REPO / "k8s" / "README.md").read_text().split())
    documented = DOCUMENTED_TOOLS.search(readme)
    assert documented is not None, "k8s/README.md no longer documents the tool servers' URLs"
    tools = {
        "browser_server_url": documented["browser"],
        "python_server_url": documented["python"],
    }
    app = {"name": "serve_app", "args": {"tools": tools}}
    path.write_text(yaml.safe_dump({"applications": [app]}))
    return path


def _rendered_tool_args(rendered: str) -> ToolArgs:
    serve_config = yaml.safe_load(yaml.safe_load(rendered)["spec"]["serveConfigV2"])
    (app,) = serve_config["applications"]
    return AppArgs.model_validate(app["args"]).tools


async def test_the_tool_servers_k8s_names_pass_the_policy_at_a_private_cluster_ip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The RayService rendered with k8s/README.md's tool servers (ClusterIP Services: their
    names resolve to private addresses) reaches them; the shipped manifests' too, if any. A
    request's `mcp` tool naming the same URL stays under `mcp_allow`: a name entry is no
    licence for a private address."""
    render = render_module()
    overlay = _tools_overlay(tmp_path / "tools.yaml")
    documented = _rendered_tool_args(render.render(render.CONFIG, (render.OVERRIDES, overlay)))
    shipped = [_rendered_tool_args(RAYSERVICE.read_text()), documented]
    urls = {
        url
        for tools in shipped
        for url in (tools.browser_server_url, tools.python_server_url)
        if url is not None
    }
    assert "http://serve-app-browser:8101/mcp" in urls
    cluster_ips = iter(f"10.96.0.{n}" for n in range(10, 250))
    resolved: dict[str, str] = {}

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        ip = resolved.setdefault(host, next(cluster_ips))
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.delenv(MCP_ALLOW_ENV, raising=False)  # the serve tier's (tests/conftest.py)
    for url in sorted(urls):
        _, ip = await tool_server_client(url, documented).reach(url)
        assert ip.is_private, url
        requests_client = McpClient(ToolArgs(mcp_allow=[url]))
        with pytest.raises(UnsafeAddress, match="private"):
            await requests_client.reach(url)


# --- KubeRay as KubeRay (v1.7.0, the CRD of tests/fixtures/k8s) expects it --------------------

# The RayServices a user applies (k8s/README.md): the plain one and the shared-tier one.
RAYSERVICES = [RAYSERVICE, REPO / "k8s" / "shared-kv" / "rayservice.yaml"]
# KubeRay's `RayServiceUpgradeType` (ray-operator/apis/ray/v1/rayservice_types.go, v1.7.0): the
# CRD types `upgradeStrategy.type` as a plain string, the operator's validation takes these.
UPGRADE_TYPES = {"None", "NewCluster", "NewClusterWithIncrementalUpgrade"}
# RayServiceSpec fields KubeRay marks "Deprecated: This field is not used anymore" (v1.7.0).
DEPRECATED_SPEC_FIELDS = {"serviceUnhealthySecondThreshold", "deploymentUnhealthySecondThreshold"}
# Ray 2.60's `ray start` handles SIGTERM by draining its node for this long at most
# (ray/_private/node.py, `_drain_node_before_shutdown`; 30 s by default), then kills its
# processes: Serve stops a draining node's replicas at the drain's deadline less their
# graceful_shutdown_timeout_s.
RAY_DRAIN_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"


def _manifest(path: Path) -> dict:
    (manifest,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return manifest


def _pod_groups(manifest: dict) -> list[dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]


def _gpus(group: dict) -> int:
    (container,) = group["template"]["spec"]["containers"]
    return int(container["resources"]["limits"].get("nvidia.com/gpu", 0))


def cluster_gpus(manifest: dict) -> int:
    """The GPUs one RayCluster of the RayService asks for at most: its worker groups'."""
    workers = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return sum(group["maxReplicas"] * _gpus(group) for group in workers)


def gpus_during_an_upgrade(manifest: dict) -> int:
    """The GPUs a change to ``rayClusterConfig`` (a new image, say) needs while KubeRay applies
    it, by the RayService's upgrade strategy (unset: `NewCluster`, KubeRay's default unless the
    operator runs with ENABLE_ZERO_DOWNTIME=false). `NewCluster` starts a whole second RayCluster
    beside the serving one and moves traffic once its app runs: at least its minimum workers,
    more as its engines autoscale; the incremental upgrade scales the new one up by
    `maxSurgePercent` of the capacity before the old one gives any back. `None` builds no
    second cluster (rayservice_controller.go, `shouldPrepareNewCluster`)."""
    total = cluster_gpus(manifest)
    strategy = manifest["spec"].get("upgradeStrategy", {})
    kind = strategy.get("type", "NewCluster")
    workers = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    if kind == "None":
        return total
    if kind == "NewCluster":
        return total + sum(max(group["minReplicas"], 1) * _gpus(group) for group in workers)
    surge = strategy.get("clusterUpgradeOptions", {}).get("maxSurgePercent", 100)
    return total + -(-total * surge // 100)


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda path: str(path.relative_to(REPO)))
def test_an_upgrade_needs_no_gpus_beyond_what_the_cluster_asks_for(path: Path) -> None:
    """The cluster asks for at most two 8-GPU workers: an upgrade strategy that needs a second
    cluster's GPUs stalls (its pending cluster waits for nodes that do not exist) where those 16
    are all there is. docs/deploy.md says what each kind of change costs under it."""
    manifest = _manifest(path)
    strategy = manifest["spec"].get("upgradeStrategy", {"type": "NewCluster"})
    assert strategy["type"] in UPGRADE_TYPES
    assert gpus_during_an_upgrade(manifest) <= cluster_gpus(manifest) == 16


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda path: str(path.relative_to(REPO)))
def test_no_field_kuberay_ignores(path: Path) -> None:
    """Deprecated and unread since KubeRay 1.1 (kuberay issue 1685): a comment promising them
    promised nothing. Nothing replaces them: KubeRay no longer restarts a cluster whose Serve
    app is unhealthy, and its `ray.io/initializing-timeout` annotation, left unset, would
    delete a cluster still loading its weights."""
    manifest = _manifest(path)
    assert not DEPRECATED_SPEC_FIELDS & set(manifest["spec"]), DEPRECATED_SPEC_FIELDS
    assert "ray.io/initializing-timeout" not in manifest["metadata"].get("annotations", {})


@pytest.mark.parametrize("path", RAYSERVICES, ids=lambda path: str(path.relative_to(REPO)))
def test_a_ray_pod_being_deleted_lets_its_replicas_drain(path: Path) -> None:
    """A node drained (or a pod deleted) sends SIGTERM: Ray drains its node for
    RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, which must cover the longest Serve drain, so each
    replica there gets its whole graceful_shutdown_timeout_s; and Kubernetes kills the pod
    only after terminationGracePeriodSeconds (30 s by default), which must cover that drain."""
    manifest = _manifest(path)
    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    (app,) = serve_config["applications"]
    longest = max(d.get("graceful_shutdown_timeout_s", 20) for d in app["deployments"])
    for group in _pod_groups(manifest):
        spec = group["template"]["spec"]
        (container,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        drain_s = float(env.get(RAY_DRAIN_ENV, 30))
        assert drain_s >= longest + 30, (container["name"], drain_s, longest)
        grace_s = spec.get("terminationGracePeriodSeconds", 30)
        assert grace_s >= drain_s + 20, (container["name"], grace_s, drain_s)


def _services_and_ingresses() -> list[dict]:
    return [
        doc
        for path in sorted((REPO / "k8s").rglob("*.yaml"))
        if path.name not in ("rayservice.template.yaml", "serve_overrides.yaml")
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc["kind"] in ("Service", "Ingress")
    ]


def test_the_ingress_sends_traffic_to_the_serving_cluster_only() -> None:
    """KubeRay's serve service (`<rayservice>-serve-svc`) selects `ray.io/cluster` of the cluster
    that serves and is switched by KubeRay once a new cluster's app runs
    (ray-operator/controllers/ray/common/service.go, `BuildServeService`). A Service of our own
    on `ray.io/serve: "true"` also selects a pending cluster's workers, whose proxies pass their
    readiness probe before its app is up: half the traffic to a cluster still loading."""
    (ingress,) = [doc for doc in _services_and_ingresses() if doc["kind"] == "Ingress"]
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    for manifest in (_manifest(p) for p in RAYSERVICES):
        assert backend["name"] == f"{manifest['metadata']['name']}-serve-svc"
        head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
        (container,) = head["containers"]
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert backend["port"]["number"] == ports["serve"]  # the port KubeRay's service has
    ray_pod_labels = [
        group["template"]["metadata"]["labels"]
        for manifest in (_manifest(p) for p in RAYSERVICES)
        for group in _pod_groups(manifest)
    ]
    for service in [doc for doc in _services_and_ingresses() if doc["kind"] == "Service"]:
        selector = service["spec"].get("selector", {})
        if any(_matches({"matchLabels": selector}, labels) for labels in ray_pod_labels):
            assert "ray.io/cluster" in selector, service["metadata"]["name"]
