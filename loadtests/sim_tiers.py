"""KV tiers behind each replica's GPU prefix cache, for sim_routing.py (`--kv-tier`).

- ``none``: the GPU prefix cache alone (`PrefixKVCache`), as before;
- ``cpu``: each replica also keeps a CPU tier, as vLLM's native offloading
  (``OffloadingConnector``) does: every block the GPU stores is copied to the replica's CPU
  memory, an LRU of its own size; a prompt's blocks past the GPU hit that the CPU tier holds are
  loaded to the GPU at ``load_tokens_per_s`` instead of computed;
- ``shared``: the CPU tiers, and one store the replicas share (llm-d's peer-to-peer pull from a
  peer's CPU tier, or LMCache with a shared backend), modelled as one LRU of every block any
  replica computed, as large as the replicas' CPU tiers together: a block no local tier holds
  is pulled from it at ``pull_tokens_per_s``.

A transfer does not hold the replica's prefill: vLLM's connector loads asynchronously and the
scheduler runs other requests meanwhile, so a turn's prefill starts once both its transfer is
done and the prefills ahead of it are. The loaded and pulled tokens count as hits (a tier hit),
not as prefill work. Events: the GPU cache emits its own; the CPU tier emits ``BlockStored`` and
``BlockRemoved`` with ``medium="CPU"`` to ``on_cpu_events`` (the replica's KV summary), as
vLLM's offloading tier reports them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from serve_app.engines.kv_events import BlockRemoved, BlockStored, KVEventSink
from serve_app.engines.prefix_cache import PrefixKVCache

KV_TIERS = ("none", "cpu", "shared")
CPU_MEDIUM = "CPU"

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


class BlockLRU:
    """Block keys, least recently used first, at most ``capacity_blocks``."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self.blocks

    def store(self, keys: Sequence[int]) -> tuple[list[int], list[int]]:
        """Stores ``keys`` (one sequence's, head first: the head ends newest, so eviction eats
        a prefix from its end); returns the keys new here and those evicted."""
        new = [key for key in keys if key not in self.blocks]
        for key in reversed(keys):
            self.blocks[key] = None
            self.blocks.move_to_end(key)
        evicted = []
        while len(self.blocks) > self.capacity_blocks:
            evicted.append(self.blocks.popitem(last=False)[0])
        return new, evicted


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


class TieredCache:
    """One replica's GPU prefix cache with the tiers behind it."""

    def __init__(
        self,
        gpu: PrefixKVCache,
        tiers: TierConfig,
        shared: BlockLRU | None = None,
        on_cpu_events: KVEventSink | None = None,
    ) -> None:
        self.gpu, self.tiers, self.shared = gpu, tiers, shared
        self.block_size = gpu.block_size
        size = tiers.cpu_tokens // gpu.block_size if tiers.kind != "none" else 0
        self.cpu = BlockLRU(size) if size else None
        self.on_cpu_events = on_cpu_events

    def peek(self, token_ids: Sequence[int]) -> Served:
        """What serving ``token_ids`` here would find, changing nothing."""
        hit = self.gpu.peek(token_ids) // self.block_size
        return self._beyond(self._prompt_keys(token_ids), hit)

    def serve(self, token_ids: Sequence[int], stored: Sequence[int], session: str) -> Served:
        """Looks ``token_ids`` up (GPU, then the tiers behind it) and stores ``stored`` (the
        prompt and its output) in the GPU cache and the tiers."""
        hit_keys = self.gpu.lookup_blocks(token_ids, session)
        if self.cpu is None and self.shared is None:
            self.gpu.insert(stored, hit_keys, session)
            return Served(len(hit_keys) * self.block_size, 0, 0, 0.0)
        prompt_keys = self._prompt_keys(token_ids)
        served = self._beyond(prompt_keys, len(hit_keys))
        known = prompt_keys[: served.cached // self.block_size]
        keys = self.gpu.insert(stored, known, session)
        self._offload(keys, session)
        return served

    def _prompt_keys(self, token_ids: Sequence[int]) -> list[int]:
        # The last prompt token is always computed (`PrefixKVCache.lookup`).
        return self.gpu.block_keys(token_ids[: max(len(token_ids) - 1, 0)])

    def _beyond(self, prompt_keys: list[int], gpu_blocks: int) -> Served:
        """The blocks past the GPU hit found in the CPU tier, then the shared one, in order."""
        loaded = pulled = 0
        for key in prompt_keys[gpu_blocks:]:
            if self.cpu is not None and key in self.cpu:
                loaded += 1
            elif self.shared is not None and key in self.shared:
                pulled += 1
            else:
                break
        size = self.block_size
        transfer_s = (
            loaded * size / self.tiers.load_tokens_per_s
            + pulled * size / self.tiers.pull_tokens_per_s
        )
        return Served(gpu_blocks * size, loaded * size, pulled * size, transfer_s)

    def _offload(self, keys: list[int], session: str) -> None:
        """Copies the sequence's blocks to the CPU tier (and the shared store), as the
        offloading connector stores each block the GPU computes."""
        if self.shared is not None:
            self.shared.store(keys)
        if self.cpu is None:
            return
        new, evicted = self.cpu.store(keys)
        if self.on_cpu_events is None:
            return
        events = []
        if new:
            events.append(
                BlockStored(tuple(new), None, self.block_size, session, medium=CPU_MEDIUM)
            )
        if evicted:
            events.append(BlockRemoved(tuple(evicted), medium=CPU_MEDIUM))
        if events:
            self.on_cpu_events(events)
