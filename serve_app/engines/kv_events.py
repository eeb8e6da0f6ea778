"""KV-cache events: which prefix blocks an engine stores and drops, as vLLM publishes them.

vLLM (``KVEventsConfig(enable_kv_cache_events=True)``) has its scheduler publish, once per
engine step, a batch of events over ZMQ (``vllm/distributed/kv_events.py``):

- ``BlockStored``: full blocks now in the prefix cache, by their block hashes, with the parent
  block's hash and the ``session_id`` of the request that stored them. With the request's
  ``kv_cache_report_mode`` set to ``"full"`` (the vLLM engine sets it on every request), vLLM
  also sends one for the blocks a request found cached (its prefix hit, parent ``None``), so
  every conversation that uses a block, not only the first to store it, is named;
- ``BlockRemoved``: blocks evicted (by hash and KV-cache group; no session);
- ``AllBlocksCleared``: the whole prefix cache reset.

These are the same three events, engine-neutral and with only the fields routing uses, plus
one of ours, ``EventsLost``: some engine steps' events never reached us, so what they stored
or removed is unknown. The vLLM engine converts vLLM's own (``serve_app.engines.
vllm_kv_events``), the simulated engine's prefix-cache model emits them itself
(``PrefixKVCache(on_events=...)``), and the engine deployment summarises either
(``serve_app.routing.kv_summary``). So CI and the routing simulator run the code path a vLLM
replica runs. What vLLM sends and how: docs/vllm.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# vLLM's ExternalBlockHash: an int (builtin hashes) or bytes (sha256 ones).
BlockHash = int | bytes


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    block_size: int
    # The request's session: our routing key (the engine passes ``GenerateRequest.session_id``).
    session_id: str | None = None
    # vLLM's KV-cache group and its kind (e.g. "full_attention", "sliding_window"); None from
    # an engine with one group.
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    # Where the copy lives: vLLM's `medium` (MEDIUM_GPU, or an offloading tier's, e.g. "CPU");
    # None from an engine with one tier, read as the GPU pool.
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    group_idx: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


@dataclass(frozen=True, slots=True)
class EventsLost:
    """Some of the engine's event batches were lost (vLLM's publisher dropped them and its
    replay buffer no longer had them): a summary cannot know what they stored or removed."""

    batches: int


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | EventsLost
# Where an engine hands its events, in order, a batch at a time (one engine step's, or one
# cache operation's): called on the engine replica's event loop.
KVEventSink = Callable[[Sequence[KVEvent]], None]
