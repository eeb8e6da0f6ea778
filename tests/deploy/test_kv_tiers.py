"""The KV tiers the GPU configs and manifests ship (docs/vllm.md, "KV tiers"):

- configs/gpt-oss.yaml gives every engine replica vLLM's native CPU tier (OffloadingConnector)
  and the load rate the replica reports; the cluster's RayService keeps it, and each GPU
  worker's /dev/shm (where vLLM 0.33 keeps the tier) holds its replicas' tiers and Ray's object
  store, within the pod's memory;
- configs/gpt-oss-shared-kv.yaml is configs/gpt-oss.yaml but for the KV tier (LMCache on a
  shared server, and the pull rate the placer prices it at, a keyword argument the placer
  takes);
- k8s/shared-kv/ renders and is complete: its RayService is that config with the cluster's
  overrides, it points LMCache at the Service of its server, whose manifest validates, and the
  image installs LMCache.

vLLM's own parsing of both configs' engine arguments: tests/vllm_cpu/test_vllm_kv_tiers.py."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from serve_app.config import AppArgs
from serve_app.engines.vllm_config import VLLMEngineConfig
from serve_app.routing.affinity import ConversationPlacer
from tests.deploy.test_deployment import deployments, gpus_per_replica, kubernetes_validate
from tests.deploy.test_k8s_manifests import SCHEMA, check, render_module, strict
from tests.support.helpers import REPO

CONFIGS = REPO / "configs"
SHARED_KV = REPO / "k8s" / "shared-kv"
GIB = 1 << 30


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def app_args(config: dict[str, Any]) -> AppArgs:
    (app,) = config["applications"]
    return AppArgs.model_validate(app["args"])


def engine(config: dict[str, Any]) -> VLLMEngineConfig:
    args = app_args(config)
    assert args.engine.kind == "vllm"
    return VLLMEngineConfig.model_validate(args.engine.options)


def rayservice(path: Path) -> dict[str, Any]:
    (service,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return service


def serve_config_of(path: Path) -> dict[str, Any]:
    return yaml.safe_load(rayservice(path)["spec"]["serveConfigV2"])


def router_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    router = deployments(config)["EngineDeployment"]["request_router_config"]
    return router["request_router_kwargs"]


def placer(config: dict[str, Any]) -> ConversationPlacer:
    """The placer the config's router builds (its kwargs but the router's own)."""
    router_own = {"report_wait_s", "use_pushed_loads"}
    options = {k: v for k, v in router_kwargs(config).items() if k not in router_own}
    return ConversationPlacer(**options)


def without_tiers(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` less its KV tier: the connector, its load rate, the shared pull rate and
    placing by pushed loads (what makes a move to a replica the queues show idle cheap)."""
    config = copy.deepcopy(config)
    (app,) = config["applications"]
    router_kwargs(config).pop("shared_kv_pull_tokens_per_s", None)
    router_kwargs(config).pop("use_pushed_loads", None)
    options = app["args"]["engine"]["options"]
    options.pop("kv_transfer_config", None)
    options.pop("kv_load_tokens_per_s", None)
    return config


def shm_bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Gi|Ti)", quantity).groups()
    return int(number) * (GIB if unit == "Gi" else 1024 * GIB)


# --- the CPU tier -----------------------------------------------------------------------------


def test_every_engine_replica_has_a_native_cpu_tier_and_reports_its_load_rate() -> None:
    cluster = serve_config_of(REPO / "k8s" / "rayservice.yaml")
    for config in (load(CONFIGS / "gpt-oss.yaml"), cluster):
        options = engine(config)
        tier = options.kv_transfer_config
        assert tier["kv_connector"] == "OffloadingConnector"
        assert tier["kv_role"] == "kv_both"
        extra = tier["kv_connector_extra_config"]
        assert extra["cpu_bytes_to_use"] > 0
        # Its events name every block hash of a chunk, so the report can count them.
        assert extra["self_describing_kv_events"] is True
        assert options.kv_load_tokens_per_s and options.kv_load_tokens_per_s > 0
        assert options.kv_cache_events  # the tier's events reach the report
        assert placer(config).predictor.shared_pull_tokens_per_s is None  # no shared tier


def test_each_gpu_workers_shm_holds_its_replicas_cpu_tiers_and_the_object_store() -> None:
    service = rayservice(REPO / "k8s" / "rayservice.yaml")
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    cpu_tier = engine(config).kv_transfer_config["kv_connector_extra_config"]["cpu_bytes_to_use"]
    per_replica_gpus = gpus_per_replica(deployments(config)["EngineDeployment"])
    for group in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        spec = group["template"]["spec"]
        (container,) = spec["containers"]
        limits = container["resources"]["limits"]
        replicas = int(limits["nvidia.com/gpu"]) // per_replica_gpus
        object_store = int(group["rayStartParams"]["object-store-memory"])
        (shm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
        size = shm_bytes(shm["emptyDir"]["sizeLimit"])
        assert replicas * cpu_tier + object_store <= size, "the tiers would overflow /dev/shm"
        # A memory-backed emptyDir counts against the pod's memory: leave the replicas room.
        assert size <= shm_bytes(limits["memory"]) - 200 * GIB


# --- the shared tier --------------------------------------------------------------------------


def test_the_shared_kv_config_is_the_gpu_config_but_for_its_kv_tier() -> None:
    base = load(CONFIGS / "gpt-oss.yaml")
    shared = load(CONFIGS / "gpt-oss-shared-kv.yaml")
    ServeDeploySchema.model_validate(shared)
    assert without_tiers(shared) == without_tiers(base)
    options = engine(shared)
    tier = options.kv_transfer_config
    assert tier["kv_connector"] == "LMCacheConnectorV1"
    assert tier["kv_role"] == "kv_both"  # every replica stores to and loads from the tier
    extra = tier["kv_connector_extra_config"]
    assert urlsplit(extra["lmcache.remote_url"]).scheme == "redis"
    assert extra["lmcache.local_cpu"] is True and extra["lmcache.max_local_cpu_size"] > 0
    # The placer knows the tier and prices a moved turn's prefix at its pull rate.
    assert (
        placer(shared).predictor.shared_pull_tokens_per_s
        == (router_kwargs(shared)["shared_kv_pull_tokens_per_s"])
    )
    assert router_kwargs(shared)["shared_kv_pull_tokens_per_s"] > 0
    assert options.kv_load_tokens_per_s > 0


def test_the_shared_kv_rayservice_is_rendered_and_is_the_config_with_the_overrides() -> None:
    render = render_module()
    path = SHARED_KV / "rayservice.yaml"
    assert path.read_text() == render.render_shared_kv(), "run: python k8s/render.py"
    config = serve_config_of(path)
    ServeDeploySchema.model_validate(config)
    assert config == render.serve_config(render.SHARED_KV_CONFIG, render.SHARED_KV_OVERRIDES)
    # The same cluster as k8s/rayservice.yaml (name, workers, model volume): only the tier.
    plain = rayservice(REPO / "k8s" / "rayservice.yaml")
    shared = rayservice(path)
    assert {k: v for k, v in shared["spec"].items() if k != "serveConfigV2"} == {
        k: v for k, v in plain["spec"].items() if k != "serveConfigV2"
    }
    assert shared["metadata"] == plain["metadata"]  # applied instead of it, never beside it
    assert without_tiers(config) == without_tiers(serve_config_of(REPO / "k8s/rayservice.yaml"))


def test_the_shared_kv_rayservice_matches_the_crd_schema(tmp_path: Path) -> None:
    schema = tmp_path / "rayservice.strict.json"
    schema.write_text(json.dumps(strict(json.loads(SCHEMA.read_text()))))
    result = check(schema, SHARED_KV / "rayservice.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_lmcache_reaches_the_kv_server_the_overlay_ships() -> None:
    docs = {
        doc["kind"]: doc for doc in yaml.safe_load_all((SHARED_KV / "kv-server.yaml").read_text())
    }
    service, deployment = docs["Service"], docs["Deployment"]
    extra = engine(serve_config_of(SHARED_KV / "rayservice.yaml")).kv_transfer_config[
        "kv_connector_extra_config"
    ]
    url = urlsplit(extra["lmcache.remote_url"])
    assert url.hostname == service["metadata"]["name"]
    assert url.port in {port["port"] for port in service["spec"]["ports"]}
    pod = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod.items()
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    args = server["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "allkeys-lru"  # a cache: evicts
    # Only the GPU workers (the engine replicas) may reach the unauthenticated server.
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pod.items()
    ((source,),) = [rule["from"] for rule in policy["ingress"]]
    workers = rayservice(SHARED_KV / "rayservice.yaml")["spec"]["rayClusterConfig"]
    for group in workers["workerGroupSpecs"]:
        labels = group["template"]["metadata"]["labels"]
        assert source["podSelector"]["matchLabels"].items() <= labels.items()


def test_the_kv_server_matches_the_kubernetes_schemas() -> None:
    result = kubernetes_validate(SHARED_KV / "kv-server.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == 3, result.stdout


def test_the_image_installs_the_shared_tiers_connector() -> None:
    """LMCache is the `shared-kv` extra, which the image's one install line names
    (tests/deploy/test_image.py checks that line resolves as one)."""
    shared_kv = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["shared-kv"]
    assert [re.match(r"[\w-]+", requirement)[0] for requirement in shared_kv] == ["lmcache"]
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert re.search(r'pip install --no-cache-dir "/tmp/serve_app\[[\w,-]*shared-kv', dockerfile)


# --- tiers that degrade, and fit their hardware -----------------------------------------------


def serve_configs_with_a_tier() -> list[tuple[str, dict[str, Any]]]:
    """Every shipped Serve config whose engines have a KV tier: configs/*.yaml and the two
    RayServices'."""
    shipped = [(path.name, load(path)) for path in sorted(CONFIGS.glob("*.yaml"))]
    shipped += [
        ("k8s/rayservice.yaml", serve_config_of(REPO / "k8s" / "rayservice.yaml")),
        ("k8s/shared-kv/rayservice.yaml", serve_config_of(SHARED_KV / "rayservice.yaml")),
    ]
    return [
        (name, config)
        for name, config in shipped
        if app_args(config).engine.kind == "vllm" and engine(config).kv_transfer_config
    ]


def test_a_block_a_tier_cannot_load_is_recomputed_not_a_failed_turn() -> None:
    """vLLM 0.33's KVTransferConfig.kv_load_failure_policy (default `fail`): a block its
    connector reports it could not load (LMCache's retrieve missing a chunk the Valkey server
    evicted between lookup and load, or a restarted server) fails the request unless it is
    `recompute` (vllm/v1/core/sched/scheduler.py). Every shipped tier sets it."""
    tiers = serve_configs_with_a_tier()
    assert {name for name, _ in tiers} == {
        "gpt-oss.yaml",
        "gpt-oss-shared-kv.yaml",
        "k8s/rayservice.yaml",
        "k8s/shared-kv/rayservice.yaml",
    }
    for name, config in tiers:
        policy = engine(config).kv_transfer_config.get("kv_load_failure_policy")
        assert policy == "recompute", (name, policy)


# The `# hardware:` line of a config: nodes, GPUs per node, host memory and /dev/shm per node.
HARDWARE = re.compile(
    r"^# hardware: (?P<nodes>\d+) nodes? x (?P<gpus>\d+) GPUs?"
    r"(?:, (?P<memory>\d+) GiB memory, (?P<shm>\d+) GiB /dev/shm)?",
    re.M,
)
# What an engine replica's node holds besides its KV tier (the configs' comments derive them):
# the weights' page cache (gpt-oss-120b, MXFP4, read once from disk and kept by the kernel) and
# each replica's processes (the replica actor, vLLM's engine core and its TP workers).
WEIGHTS_PAGE_CACHE = 65 * 10**9
PROCESS_MEMORY_PER_REPLICA = 20 * GIB
# Ray's object store when `object-store-memory` is not set (ray/_private/utils.py,
# resolve_object_store_memory): 30% of the node's memory, at most 200 GB, in /dev/shm.
OBJECT_STORE_SHARE, OBJECT_STORE_MAX = 0.3, 200 * 10**9


def host_needs(config: dict[str, Any], replicas: int, object_store: int) -> tuple[int, int]:
    """(host memory, /dev/shm) a node running ``replicas`` engine replicas of ``config`` needs:
    the native CPU tier lives in /dev/shm (vLLM 0.33: one region per engine), LMCache's local
    CPU buffer is pinned memory of each TP rank (not /dev/shm); /dev/shm pages are memory."""
    options = engine(config)
    tier = options.kv_transfer_config or {}
    extra = tier.get("kv_connector_extra_config", {})
    shm = object_store
    pinned = 0
    if tier.get("kv_connector") == "OffloadingConnector":
        shm += replicas * extra["cpu_bytes_to_use"]
    if tier.get("kv_connector") == "LMCacheConnectorV1":
        ranks = options.tensor_parallel_size
        pinned += replicas * ranks * int(extra["lmcache.max_local_cpu_size"] * GIB)
    memory = shm + pinned + WEIGHTS_PAGE_CACHE + replicas * PROCESS_MEMORY_PER_REPLICA
    return memory, shm


@pytest.mark.parametrize("name", [name for name, _ in serve_configs_with_a_tier()])
def test_each_configs_kv_tiers_fit_the_host_memory_and_shm_of_its_hardware(name: str) -> None:
    """A config's `# hardware:` line names each node's memory and /dev/shm; a RayService's GPU
    worker pod has its memory limit, its /dev/shm volume and Ray's object store set: the engine
    replicas a node holds, with their KV tiers, fit both. Too big a tier fails at start-up
    (vLLM cannot map its region) or later (the node's OOM killer)."""
    config = dict(serve_configs_with_a_tier())[name]
    per_replica_gpus = gpus_per_replica(deployments(config)["EngineDeployment"])
    autoscaled = deployments(config)["EngineDeployment"]["autoscaling_config"]["max_replicas"]
    if name.startswith("k8s/"):
        path = REPO / name
        for group in rayservice(path)["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
            spec = group["template"]["spec"]
            (container,) = spec["containers"]
            limits = container["resources"]["limits"]
            replicas = int(limits["nvidia.com/gpu"]) // per_replica_gpus
            object_store = int(group["rayStartParams"]["object-store-memory"])
            (shm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
            memory, shm_needed = host_needs(config, replicas, object_store)
            assert shm_needed <= shm_bytes(shm["emptyDir"]["sizeLimit"]), (name, shm_needed)
            assert memory <= shm_bytes(limits["memory"]), (name, memory / GIB)
        return
    hardware = HARDWARE.search((CONFIGS / name).read_text())
    assert hardware and hardware["memory"], f"{name}'s `# hardware:` names no memory and /dev/shm"
    memory_bytes = int(hardware["memory"]) * GIB
    replicas = min(autoscaled, int(hardware["gpus"]) // per_replica_gpus)
    object_store = min(int(OBJECT_STORE_SHARE * memory_bytes), OBJECT_STORE_MAX)
    memory, shm_needed = host_needs(config, replicas, object_store)
    assert shm_needed <= int(hardware["shm"]) * GIB, (name, shm_needed / GIB)
    assert memory <= memory_bytes, (name, memory / GIB)
