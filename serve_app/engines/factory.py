"""Build the engine a config names. vLLM is imported only when chosen."""

from __future__ import annotations

from serve_app.config import EngineConfig
from serve_app.engines.base import Engine


def make_engine(config: EngineConfig) -> Engine:
    if config.kind == "vllm":
        from serve_app.engines.vllm_engine import VLLMEngine, VLLMEngineConfig

        return VLLMEngine(VLLMEngineConfig.model_validate(config.options))
    from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig

    return SimulatedEngine(SimulatedEngineConfig.model_validate(config.options))
