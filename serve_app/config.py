"""Typed application arguments: the ``args`` of a Serve config's application."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["simulated", "vllm"] = "simulated"
    # Options of the chosen engine: SimulatedEngineConfig or VLLMEngineConfig fields.
    options: dict[str, Any] = Field(default_factory=dict)


class AppArgs(BaseModel):
    """What ``serve_app.app:build_app`` takes (validated by Ray Serve from the YAML ``args``)."""

    model_config = ConfigDict(extra="forbid")

    # The name clients put in `model`; aliases are accepted too (e.g. "openai/gpt-oss-120b").
    model: str = "gpt-oss-120b"
    model_aliases: list[str] = Field(default_factory=list)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    # Context window of the model: prompt + output tokens.
    max_context_tokens: int = Field(default=131072, gt=0)
    # Used when a request sets no max_output_tokens (bounded by what the context leaves).
    default_max_output_tokens: int = Field(default=32768, gt=0)

    def served_names(self) -> set[str]:
        return {self.model, *self.model_aliases}
