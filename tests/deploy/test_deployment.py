"""What the shipped configs and manifests deploy fits what they run on:

- each config says its hardware (`# hardware: N node(s) x G GPUs`) and the k8s cluster's comes
  from its worker groups: engine max_replicas x GPUs per replica fit in it (a replica's GPUs
  on one node: STRICT_PACK), or the replicas past it wait for GPUs forever;
- ingress replicas that can run on several nodes share one store (PostgreSQL), never a
  node-local SQLite file, and a replica on SQLite refuses to start on such a cluster;
- the weights come from the model volume, filled once by a Job, read offline by the engines;
- the plain manifests validate against Kubernetes' own schemas, unknown fields rejected.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from serve_app.config import STORE_URL_ENV, AppArgs, StoreConfig
from serve_app.store.shared import StoreNotShared, require_shared_store
from tests.support.helpers import REPO

K8S = REPO / "k8s"
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
HARDWARE = re.compile(r"^# hardware: (\d+) nodes? x (\d+) GPUs?\b", re.MULTILINE)
KUBERNETES_VALIDATE = str(Path(sys.executable).parent / "kubernetes-validate")


def docs(name: str) -> dict[str, dict[str, Any]]:
    """The documents of k8s/NAME by kind."""
    return {doc["kind"]: doc for doc in yaml.safe_load_all((K8S / name).read_text())}


def rayservice() -> dict[str, Any]:
    return docs("rayservice.yaml")["RayService"]


def cluster_serve_config() -> dict[str, Any]:
    return yaml.safe_load(rayservice()["spec"]["serveConfigV2"])


def deployments(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (app,) = config["applications"]
    return {deployment["name"]: deployment for deployment in app["deployments"]}


def max_replicas(deployment: dict[str, Any]) -> int:
    autoscaling = deployment.get("autoscaling_config")
    return autoscaling["max_replicas"] if autoscaling else deployment.get("num_replicas", 1)


def gpus_per_replica(deployment: dict[str, Any]) -> float:
    bundles = deployment.get("placement_group_bundles") or []
    actor = deployment.get("ray_actor_options", {}).get("num_gpus", 0)
    return actor + sum(bundle.get("GPU", 0) for bundle in bundles)


def replicas_that_fit(config: dict[str, Any], nodes: int, gpus_per_node: int) -> float:
    """How many engine replicas the hardware holds (a replica's GPUs on one node)."""
    gpus = gpus_per_replica(deployments(config)["EngineDeployment"])
    return float("inf") if gpus == 0 else nodes * (gpus_per_node // gpus)


def ray_containers() -> list[dict[str, Any]]:
    cluster = rayservice()["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [container for group in groups for container in group["template"]["spec"]["containers"]]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {var["name"]: var for var in container.get("env", [])}


# --- the engine's GPUs ------------------------------------------------------------------------


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_each_config_says_its_hardware_and_its_engine_replicas_fit(path: Path) -> None:
    found = HARDWARE.search(path.read_text())
    assert found, f"{path.name} says no `# hardware: N node(s) x G GPUs`"
    nodes, gpus_per_node = int(found[1]), int(found[2])
    config = yaml.safe_load(path.read_text())
    engine = deployments(config)["EngineDeployment"]
    assert max_replicas(engine) <= replicas_that_fit(config, nodes, gpus_per_node), path.name


def test_the_cluster_engine_replicas_fit_its_gpu_workers() -> None:
    config = cluster_serve_config()
    workers = rayservice()["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    fit = 0.0
    for group in workers:
        (container,) = group["template"]["spec"]["containers"]
        gpus_per_node = int(container["resources"]["limits"].get("nvidia.com/gpu", 0))
        fit += replicas_that_fit(config, group["maxReplicas"], gpus_per_node)
    engine = deployments(config)["EngineDeployment"]
    assert max_replicas(engine) <= fit
    # Every GPU the workers have is used at the top of the autoscaling range.
    assert max_replicas(engine) == fit


def test_an_engine_replica_has_the_gpus_its_tensor_parallel_workers_need() -> None:
    for config in [
        cluster_serve_config(),
        yaml.safe_load((REPO / "configs/gpt-oss.yaml").read_text()),
    ]:
        (app,) = config["applications"]
        options = app["args"]["engine"]["options"]
        engine = deployments(config)["EngineDeployment"]
        assert gpus_per_replica(engine) == options["tensor_parallel_size"]


# Serve's graceful_shutdown_timeout_s when a deployment sets none.
SERVE_DEFAULT_SHUTDOWN_S = 20.0


def serve_configs() -> list[tuple[str, dict[str, Any]]]:
    """Every Serve config that ships: configs/*.yaml and the RayService's."""
    shipped = [(path.name, yaml.safe_load(path.read_text())) for path in CONFIGS]
    return [*shipped, ("k8s/rayservice.yaml", cluster_serve_config())]


@pytest.mark.parametrize("name", [name for name, _ in serve_configs()])
def test_background_runs_get_their_grace_before_serve_kills_the_ingress_replica(name: str) -> None:
    """A stopped ingress replica lets its background runs go on `background.shutdown_grace_s`,
    then ends those left `failed`: that must happen before Serve kills it, at its deployment's
    graceful_shutdown_timeout_s (which a replica cannot read through Ray's public API), with a
    margin of a tenth of the budget or 5 s, whichever is less, to end them and close the store."""
    config = dict(serve_configs())[name]
    (app,) = config["applications"]
    grace_s = AppArgs.model_validate(app["args"]).background.shutdown_grace_s
    ingress = deployments(config)["ResponsesIngress"]
    budget_s = ingress.get("graceful_shutdown_timeout_s", SERVE_DEFAULT_SHUTDOWN_S)
    assert grace_s <= budget_s - min(5.0, budget_s / 10), (name, grace_s, budget_s)
    # And no shorter than the engine's turns need (a run cut early is a failed run).
    assert grace_s >= budget_s - 5.0, (name, grace_s, budget_s)


# --- one store for the cluster ----------------------------------------------------------------


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_a_config_for_several_nodes_shares_its_store(path: Path) -> None:
    nodes = int(HARDWARE.search(path.read_text())[1])
    (app,) = yaml.safe_load(path.read_text())["applications"]
    store = StoreConfig.model_validate(app["args"].get("store", {}))
    assert nodes == 1 or make_url(store.url).get_backend_name() == "postgresql", path.name


def test_every_ray_container_of_the_cluster_uses_the_postgres_of_k8s() -> None:
    postgres = docs("postgres.yaml")
    service = postgres["Service"]["metadata"]["name"]
    (server,) = postgres["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    server_env = env_of(server)
    (app,) = cluster_serve_config()["applications"]
    assert "store" not in app["args"], "the cluster's store comes from SERVE_APP_STORE_URL"
    for container in ray_containers():
        env = env_of(container)
        url = make_url(env[STORE_URL_ENV]["value"])
        assert url.drivername == "postgresql+asyncpg"
        assert url.host == service and url.port == 5432
        assert url.username == server_env["POSTGRES_USER"]["value"]
        assert url.database == server_env["POSTGRES_DB"]["value"]
        # The password: Kubernetes expands $(VAR) from the variable defined before it, read from
        # the key the server's own password comes from.
        (variable,) = re.findall(r"\$\((\w+)\)", url.password)
        names = list(env)
        assert names.index(variable) < names.index(STORE_URL_ENV)
        assert env[variable]["valueFrom"] == server_env["POSTGRES_PASSWORD"]["valueFrom"]


def test_a_node_local_store_refuses_a_cluster_of_several_nodes() -> None:
    sqlite = "sqlite+aiosqlite:////data/responses.db"
    require_shared_store(sqlite, nodes=1)
    require_shared_store("postgresql+asyncpg://app:secret@db/app", nodes=3)
    with pytest.raises(StoreNotShared) as refused:
        require_shared_store(sqlite, nodes=2)
    message = str(refused.value)
    assert "/data/responses.db" in message and "2 nodes" in message
    assert STORE_URL_ENV in message and "postgresql+asyncpg://" in message


def test_the_store_url_from_the_environment_overrides_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = AppArgs.model_validate({"store": {"url": "sqlite+aiosqlite:////tmp/x.db"}})
    monkeypatch.delenv(STORE_URL_ENV, raising=False)
    assert args.store.resolved_url() == "sqlite+aiosqlite:////tmp/x.db"
    monkeypatch.setenv(STORE_URL_ENV, "postgresql+asyncpg://app:secret@db/app")
    assert args.store.resolved_url() == "postgresql+asyncpg://app:secret@db/app"


# --- the weights, offline ---------------------------------------------------------------------


def test_the_engines_read_the_weights_the_job_downloads_offline() -> None:
    models = docs("models.yaml")
    claim = models["PersistentVolumeClaim"]
    assert "ReadWriteMany" in claim["spec"]["accessModes"]  # every GPU node mounts it
    job = models["Job"]["spec"]["template"]["spec"]
    (download,) = job["containers"]
    command = download["command"]
    assert command[:3] == ["hf", "download", "openai/gpt-oss-120b"]
    target = Path(command[command.index("--local-dir") + 1])
    (job_volume,) = job["volumes"]
    assert job_volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    (job_mount,) = download["volumeMounts"]
    assert target.is_relative_to(job_mount["mountPath"])

    (app,) = cluster_serve_config()["applications"]
    assert app["args"]["engine"]["options"]["model"] == str(target)
    workers = rayservice()["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    for group in workers:
        spec = group["template"]["spec"]
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        (container,) = spec["containers"]
        (mount,) = [
            m for m in container["volumeMounts"] if m["mountPath"] == job_mount["mountPath"]
        ]
        assert mount["readOnly"] is True
        claimed = volumes[mount["name"]]["persistentVolumeClaim"]
        assert claimed["claimName"] == claim["metadata"]["name"]
    for container in ray_containers():
        assert env_of(container)["HF_HUB_OFFLINE"]["value"] == "1"


# --- Kubernetes' own schemas ------------------------------------------------------------------


def kubernetes_validate(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [KUBERNETES_VALIDATE, "--strict", "--kubernetes-version", "1.33", *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_plain_manifests_match_the_kubernetes_schemas() -> None:
    plain = [K8S / "models.yaml", K8S / "postgres.yaml", K8S / "ingress.yaml"]
    result = kubernetes_validate(*plain)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == 5, result.stdout


def test_the_schemas_reject_an_unknown_field(tmp_path: Path) -> None:
    statefulset = docs("postgres.yaml")["StatefulSet"]
    statefulset["spec"]["template"]["spec"]["containers"][0]["readinessProb"] = {}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(statefulset))
    assert kubernetes_validate(path).returncode != 0


# --- what `serve deploy` brings to the replicas -----------------------------------------------

# The production configs, deployed with `serve deploy` onto a cluster `ray start` made.
PRODUCTION = [REPO / "configs" / "gpt-oss.yaml", REPO / "configs" / "gpt-oss-shared-kv.yaml"]
# What never goes in a config: the keys, the store's URL (it carries a password), tokens.
SECRET_NAME = re.compile(r"KEY|TOKEN|PASSWORD|SECRET|STORE_URL", re.I)


def runtime_env_vars(config: dict[str, Any]) -> dict[str, str]:
    (app,) = config["applications"]
    return app.get("runtime_env", {}).get("env_vars", {})


@pytest.mark.parametrize("path", PRODUCTION, ids=lambda path: path.name)
def test_a_production_config_brings_the_fast_path_its_replicas_read(path: Path) -> None:
    """`serve deploy` of a production config onto a cluster runs its replicas with the
    replica-side part of configs/fast-path.env whatever the nodes' environment: the config's
    runtime_env has it, with the file's values, and HF_HUB_OFFLINE (the weights are on every
    node already, docs/deploy.md). The cluster-wide part (HAProxy, direct ingress) stays out:
    every Ray process, the controller included, must agree on it (serve_app/fast_path.py)."""
    from serve_app.fast_path import CLUSTER_WIDE, replica_env

    env = runtime_env_vars(yaml.safe_load(path.read_text()))
    assert replica_env() and {name: env.get(name) for name in replica_env()} == replica_env()
    assert env.get("HF_HUB_OFFLINE") == "1"
    assert not CLUSTER_WIDE & set(env), CLUSTER_WIDE & set(env)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_no_config_carries_a_secret_or_a_fast_path_value_of_its_own(path: Path) -> None:
    """A config's runtime_env holds no key, token or password (the API keys stay in the
    environment or the Secret), and a fast-path variable it sets has configs/fast-path.env's
    value: one place says what the fast path is."""
    from serve_app.fast_path import CLUSTER_WIDE, read_env_file

    env = runtime_env_vars(yaml.safe_load(path.read_text()))
    assert not [name for name in env if SECRET_NAME.search(name)], env
    fast_path = read_env_file()
    assert {k: v for k, v in env.items() if k in fast_path} == {
        k: fast_path[k] for k in env if k in fast_path
    }
    assert not CLUSTER_WIDE & set(env)
    assert all(isinstance(value, str) for value in env.values())  # Ray takes strings only


# --- the moderation model (a commented block in each shipped config) -------------------------

# A line of a config's moderation block: `#~ ` then the YAML it holds once uncommented. One
# right after a line setting the same key replaces that line (the value with moderation on).
MODERATION_LINE = re.compile(r"^(\s*)#~ ?(.*)$")


def with_moderation(text: str) -> str:
    """``text`` with its moderation block uncommented, as an operator turns it on."""
    lines: list[str] = []
    for line in text.splitlines():
        found = MODERATION_LINE.match(line)
        if found is None:
            lines.append(line)
            continue
        indent, content = found[1], found[2]
        key = content.split(":", 1)[0]
        previous = lines[-1] if lines else ""
        if previous.startswith(indent + key + ":") and not content.startswith("-"):
            lines[-1] = indent + content
        else:
            lines.append(indent + content)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_moderation_is_off_unless_asked(path: Path) -> None:
    config = yaml.safe_load(path.read_text())
    (app,) = config["applications"]
    assert AppArgs.model_validate(app["args"]).moderation is None
    assert "ModerationEngine" not in deployments(config)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_each_configs_moderation_block_fits_its_hardware(path: Path) -> None:
    """Uncommented, the block is a valid config whose moderation model and engine replicas
    all fit the GPUs its `# hardware:` line says (no replica waits for GPUs forever)."""
    text = path.read_text()
    assert "#~ moderation:" in text, f"{path.name} has no commented moderation block"
    config = yaml.safe_load(with_moderation(text))
    (app,) = config["applications"]
    args = AppArgs.model_validate(app["args"])
    assert args.moderation is not None
    found = HARDWARE.search(text)
    assert found
    nodes, gpus_per_node = int(found[1]), int(found[2])
    placed = deployments(config)
    moderation = placed["ModerationEngine"]
    used = sum(
        max_replicas(placed[name]) * gpus_per_replica(placed[name])
        for name in ("EngineDeployment", "ModerationEngine")
    )
    assert used <= nodes * gpus_per_node, f"{path.name}: {used} GPUs of {nodes * gpus_per_node}"
    if args.moderation.engine.kind == "vllm":
        options = args.moderation.engine.options
        assert gpus_per_replica(moderation) == options.get("tensor_parallel_size", 1)
        assert "safeguard" in options["model"]
