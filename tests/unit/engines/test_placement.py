"""Deployment options for vLLM engine replicas: pure functions, checked against Ray Serve's own
option validation (which needs no running Ray)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from ray import serve

from serve_app.engines.placement import engine_placement


class _Replica:
    pass


def _serve_accepts(options: dict[str, Any]) -> None:
    # Deployment.options builds Serve's ReplicaConfig, which validates bundles and that the
    # replica actor fits in the first bundle (where Serve pins it).
    serve.deployment(_Replica).options(**options)


def test_single_gpu_replica_holds_its_gpu_without_placement_group() -> None:
    options = engine_placement(1)

    assert options == {"ray_actor_options": {"num_cpus": 1, "num_gpus": 1}}
    _serve_accepts(options)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_one_gpu_bundle_per_shard_strict_pack(tp: int) -> None:
    options = engine_placement(tp)

    bundles = options["placement_group_bundles"]
    assert options["placement_group_strategy"] == "STRICT_PACK"
    assert len(bundles) == tp
    assert all(bundle["GPU"] == 1 for bundle in bundles)
    # The replica actor (bundle 0) holds CPU only; the worker bundles hold no CPU.
    assert options["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0}
    assert bundles[0] == {"CPU": 1, "GPU": 1}
    assert all("CPU" not in bundle for bundle in bundles[1:])
    _serve_accepts(options)


def test_replica_cpus_go_into_the_first_bundle() -> None:
    options = engine_placement(4, cpus_for_replica=2)

    assert options["ray_actor_options"]["num_cpus"] == 2
    assert options["placement_group_bundles"][0] == {"CPU": 2, "GPU": 1}
    _serve_accepts(options)


def test_zero_replica_cpus_leave_gpu_only_bundles() -> None:
    options = engine_placement(2, cpus_for_replica=0)

    assert options["placement_group_bundles"] == [{"GPU": 1}, {"GPU": 1}]
    _serve_accepts(options)


def test_fractional_gpu_bundles_tell_vllm_workers_their_share() -> None:
    options = engine_placement(2, gpus_per_bundle=0.5)

    assert [bundle["GPU"] for bundle in options["placement_group_bundles"]] == [0.5, 0.5]
    env = options["ray_actor_options"]["runtime_env"]["env_vars"]
    assert env == {"VLLM_RAY_PER_WORKER_GPUS": "0.5"}
    _serve_accepts(options)


def test_whole_gpu_bundles_set_no_runtime_env() -> None:
    assert "runtime_env" not in engine_placement(4)["ray_actor_options"]


@pytest.mark.parametrize(
    ("tp", "kwargs"),
    [
        (0, {}),
        (2, {"gpus_per_bundle": 2}),  # vLLM rejects bundles with more than one GPU
        (2, {"gpus_per_bundle": 0}),
        (2, {"cpus_for_replica": -1}),
    ],
)
def test_invalid_arguments_are_rejected(tp: int, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        engine_placement(tp, **kwargs)


def test_building_options_starts_no_ray() -> None:
    # In a fresh interpreter: this test process may already be joined to the app's cluster.
    code = (
        "import ray; from ray import serve;"
        "from serve_app.engines.placement import engine_placement;"
        "serve.deployment(lambda: None).options(**engine_placement(8));"
        "assert not ray.is_initialized()"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_production_config_places_engines_as_engine_placement_says() -> None:
    import yaml

    from tests.support.helpers import REPO

    config = yaml.safe_load((REPO / "configs" / "gpt-oss.yaml").read_text())
    app = config["applications"][0]
    tp = app["args"]["engine"]["options"]["tensor_parallel_size"]
    engine = next(d for d in app["deployments"] if d["name"] == "EngineDeployment")
    expected = engine_placement(tp)
    assert engine["placement_group_bundles"] == expected["placement_group_bundles"]
    assert engine["placement_group_strategy"] == expected["placement_group_strategy"]
    assert engine["ray_actor_options"] == expected["ray_actor_options"]
