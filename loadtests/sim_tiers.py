"""KV tiers behind each replica's GPU prefix cache, for sim_routing.py (`--kv-tier`).

The tiers are the engine's own model (``serve_app.engines.prefix_cache``: `PrefixKVCache`'s
CPU tier and `SharedKVTier`), so the replay, the simulated engine on Ray and the router's TTFT
model agree; this module sizes and prices them from published measurements:

- ``none``: the GPU prefix cache alone, as before;
- ``cpu``: each replica also keeps a CPU tier, as vLLM's native offloading
  (``OffloadingConnector``) does: every block computed is written to the replica's CPU memory,
  an LRU of its own; a prompt's blocks past the GPU hit that the CPU tier holds are loaded at
  ``load_tokens_per_s`` instead of computed;
- ``shared``: the CPU tiers, and one store the replicas share (llm-d's peer-to-peer pull from a
  peer's CPU tier, or LMCache with a shared backend), as large as the replicas' CPU tiers
  together: a block no local tier holds is pulled from it at ``pull_tokens_per_s``.

As in the simulated engine (``serve_app.engines.simulated.timing``), a load or a pull holds the
request's place in its replica's prefill queue: the safe side (vLLM's connector transfers
asynchronously and may run other prefills meanwhile). Loaded and pulled tokens count as hits
(any tier), not as prefill work. The CPU tier's events (``medium="CPU"``) reach the replica's KV
summary, which reports them as ``cpu_held_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from serve_app.engines.kv_events import KVEventSink
from serve_app.engines.prefix_cache import CacheHit, PrefixKVCache, SharedKVTier

KV_TIERS = ("none", "cpu", "shared")

# Published measurements, as ratios to the prefill rate so that they scale with the replay's
# engine (docs/routing.md, "KV tiers", cites them):
# - CPU -> GPU load: vLLM's offloading connector on H100 gives 2-22x lower TTFT on a prompt
#   served from CPU than on one recomputed (blog.vllm.ai, 2026-01-08), and a CPU-tier hit is
#   transfer-bound at ~54 GB/s, up to 56x faster than a miss (vLLM 0.18.1 on H20). 10x is the
#   conservative middle of the end-to-end gains.
CPU_LOAD_X = 10.0
# - peer pull: llm-d's P2P KV-cache sharing pulls a 16k-token prefix in 86 ms where recomputing
#   it takes 510 ms on an H200: 5.9x the prefill rate.
SHARED_PULL_X = 510 / 86
# - CPU tier size per replica: a DGX H100 node (2 TB of host memory, 8 GPUs) runs 4 replicas of
#   configs/gpt-oss.yaml (TP=2, ~79 GB of GPU KV cache each); 400 GB of host memory each for
#   the CPU tier leaves 400 GB for the system, Ray's object store and the processes: 5x the
#   GPU cache.
CPU_TIER_X = 5.0


@dataclass(frozen=True)
class TierConfig:
    kind: str  # one of KV_TIERS
    cpu_tokens: int  # each replica's CPU tier
    load_tokens_per_s: float
    pull_tokens_per_s: float

    @classmethod
    def scaled(
        cls,
        kind: str,
        gpu_tokens: int,
        prefill_tokens_per_s: float,
        cpu_tokens: int | None = None,
        load_tokens_per_s: float | None = None,
        pull_tokens_per_s: float | None = None,
    ) -> TierConfig:
        """The tiers of a replica whose GPU cache holds ``gpu_tokens`` and prefills at
        ``prefill_tokens_per_s``, sized and priced by the published ratios unless given."""
        if kind not in KV_TIERS:
            raise ValueError(f"kv tier must be one of {KV_TIERS}, got {kind!r}")
        return cls(
            kind,
            cpu_tokens if cpu_tokens is not None else round(CPU_TIER_X * gpu_tokens),
            load_tokens_per_s or CPU_LOAD_X * prefill_tokens_per_s,
            pull_tokens_per_s or SHARED_PULL_X * prefill_tokens_per_s,
        )


@dataclass(frozen=True)
class Served:
    """How a prompt was served: ``gpu`` tokens hit, ``loaded`` from the CPU tier, ``pulled``
    from the shared one, and the transfer's time."""

    gpu: int
    loaded: int
    pulled: int
    transfer_s: float

    @property
    def cached(self) -> int:
        return self.gpu + self.loaded + self.pulled


def shared_tier(tiers: TierConfig, replicas: int, block_size: int) -> SharedKVTier | None:
    """The store the replicas share, as large as their CPU tiers together (None: no such)."""
    if tiers.kind != "shared":
        return None
    return SharedKVTier(replicas * tiers.cpu_tokens, block_size)


def tiered_cache(
    block_size: int,
    gpu_tokens: int,
    tiers: TierConfig,
    shared: SharedKVTier | None,
    on_events: KVEventSink | None = None,
) -> PrefixKVCache:
    """One replica's GPU prefix cache with the tiers behind it."""
    return PrefixKVCache(
        block_size,
        gpu_tokens,
        on_events=on_events,
        cpu_capacity_tokens=tiers.cpu_tokens if tiers.kind != "none" else 0,
        shared=shared,
    )


def served(hit: CacheHit, tiers: TierConfig) -> Served:
    """``hit`` by tier, with the time its loads and pulls take."""
    transfer_s = hit.loaded_tokens / tiers.load_tokens_per_s
    transfer_s += hit.pulled_tokens / tiers.pull_tokens_per_s
    return Served(hit.gpu_tokens, hit.loaded_tokens, hit.pulled_tokens, transfer_s)


def serve(
    cache: PrefixKVCache,
    tiers: TierConfig,
    token_ids: Sequence[int],
    stored: Sequence[int],
    session: str,
) -> Served:
    """Looks ``token_ids`` up in ``cache`` (GPU, then the tiers behind it) and stores
    ``stored`` (the prompt and its output), as the simulated engine does."""
    hit = cache.lookup_hit(token_ids, session)
    cache.insert(stored, hit.keys, session)
    return served(hit, tiers)


def peek(cache: PrefixKVCache, tiers: TierConfig, token_ids: Sequence[int]) -> Served:
    """What serving ``token_ids`` from ``cache`` would find, changing nothing."""
    return served(cache.peek_hit(token_ids), tiers)
