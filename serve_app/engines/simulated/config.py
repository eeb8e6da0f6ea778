"""The simulated engine's settings (``engine.options`` of a config with ``kind: simulated``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.engines.prefix_cache import SharedKVTier, SharedTier

# The shared tiers of this process, one per (size, block size): the engines of one process
# (in-process tests, the local app) share one. Ray Serve replicas share their app's store in
# a Ray actor instead (`shared_tier`).
_SHARED_TIERS: dict[tuple[int, int], SharedKVTier] = {}


class SimulatedEngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Prefix cache model: block size and capacity (KV tokens the replica can keep cached).
    block_size: int = Field(default=16, gt=0)
    kv_cache_tokens: int = Field(default=262_144, gt=0)
    # Prefill speed for uncached prompt tokens; one prefill runs at a time, earliest deadline
    # first (GenerateRequest.deadline_s; timing.py).
    prefill_tokens_per_s: float = Field(default=20_000, gt=0)
    # A prefill runs this many tokens' time at once, and between chunks the request due first
    # takes the accelerator (vLLM's chunked prefill, its step's max_num_batched_tokens); None:
    # a prefill, once started, runs whole.
    prefill_chunk_tokens: int | None = Field(default=None, gt=0)
    # Decode slots (vLLM's max_num_seqs): requests held from the start of their prefill to their
    # end; one finding none free waits, in deadline order. None: no limit.
    max_num_seqs: int | None = Field(default=None, gt=0)
    # A CPU tier behind the GPU cache (vLLM's OffloadingConnector): KV tokens it holds, 0 for
    # none (the default: today's model). Every block computed is written to it too, and a
    # prefix found only there is loaded at `kv_load_tokens_per_s` instead of computed.
    cpu_kv_cache_tokens: int = Field(default=0, ge=0)
    # CPU -> GPU load rate. gpt-oss-120b keeps 36 layers x 8 KV heads x 64 x 2 (K, V) x 2 bytes
    # = 72 KiB per token; about 40 GB/s of pinned host-to-device copy over PCIe 5 x16 moves
    # some 500,000 tokens/s.
    kv_load_tokens_per_s: float = Field(default=500_000, gt=0)
    # A KV tier every replica of the app shares (LMCache / Mooncake style), KV tokens; 0 for
    # none. Written when a replica stores a block; a prefix found only there is pulled at
    # `shared_kv_pull_tokens_per_s` (llm-d: a 16k-token prefix pulled in 86 ms on H200).
    shared_kv_cache_tokens: int = Field(default=0, ge=0)
    shared_kv_pull_tokens_per_s: float = Field(default=190_000, gt=0)
    # Decode speed of one request decoding alone.
    decode_tokens_per_s: float = Field(default=200, gt=0)
    # Each other request decoding at the same time slows a decode step by this fraction.
    batch_slowdown: float = Field(default=0.02, ge=0)
    # Length in tokens of the default answer (it is never shorter than its fixed sentences).
    default_output_tokens: int = Field(default=64, ge=1)
    # A script file (YAML/JSON) or the script itself; None falls back to $SERVE_APP_SIM_SCRIPT.
    script: str | dict[str, Any] | None = None
    # Seeds the default answer's filler words (mixed with the prompt).
    seed: int = 0

    @model_validator(mode="after")
    def _cache_holds_a_block(self) -> SimulatedEngineConfig:
        if self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must be at least block_size")
        for name in ("cpu_kv_cache_tokens", "shared_kv_cache_tokens"):
            if 0 < getattr(self, name) < self.block_size:
                raise ValueError(f"{name} must be 0 (no tier) or at least block_size")
        return self


def shared_tier(config: SimulatedEngineConfig) -> SharedTier | None:
    """The shared tier of ``config``'s size (None: it configures none): in a Ray Serve
    replica, the app's store in a Ray actor, which every replica of the app shares; elsewhere
    the process's own."""
    if not config.shared_kv_cache_tokens:
        return None
    key = (config.shared_kv_cache_tokens, config.block_size)
    # Imported here: only a configured shared tier needs Ray.
    from serve_app.engines.simulated.shared_tier import in_serve_replica, ray_shared_tier

    app_name = in_serve_replica()
    if app_name is not None:
        return ray_shared_tier(app_name, *key)
    tier = _SHARED_TIERS.get(key)
    if tier is None:
        tier = _SHARED_TIERS[key] = SharedKVTier(*key)
    return tier
