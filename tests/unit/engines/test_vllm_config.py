"""The vLLM engine's KV-tier options (serve_app/engines/vllm_config.py): vLLM's
kv_transfer_config passed through as given, its load rate reported, bad values refused when
the config loads (not when the engine starts on a GPU). vLLM's own parsing of both shipped
tiers: tests/vllm_cpu/test_vllm_kv_tiers.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serve_app.engines.vllm_config import VLLMEngineConfig
from serve_app.engines.vllm_engine import VLLMEngine

CPU_TIER = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30},
}


def test_the_kv_transfer_config_reaches_vllms_engine_args_as_given() -> None:
    args = VLLMEngineConfig(model="m", kv_transfer_config=CPU_TIER).engine_args()
    assert args["kv_transfer_config"] == CPU_TIER
    assert "kv_transfer_config" not in VLLMEngineConfig(model="m").engine_args()


def test_a_tier_without_a_connector_or_set_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="names no kv_connector"):
        VLLMEngineConfig(model="m", kv_transfer_config={"kv_role": "kv_both"})
    with pytest.raises(ValidationError, match="kv_transfer_config"):
        VLLMEngineConfig(model="m", engine_kwargs={"kv_transfer_config": CPU_TIER})
    with pytest.raises(ValidationError):
        VLLMEngineConfig(model="m", kv_transfer_config=CPU_TIER, kv_load_tokens_per_s=0)


def test_the_engine_reports_its_tiers_load_rate_only_with_a_tier() -> None:
    tiered = VLLMEngineConfig(model="m", kv_transfer_config=CPU_TIER, kv_load_tokens_per_s=9e5)
    assert VLLMEngine(tiered).kv_load_tokens_per_s() == 9e5
    assert (
        VLLMEngine(VLLMEngineConfig(model="m", kv_load_tokens_per_s=9e5)).kv_load_tokens_per_s()
        is None
    )
