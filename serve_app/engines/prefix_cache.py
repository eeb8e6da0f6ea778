"""A model of vLLM's automatic prefix cache: full KV blocks keyed by chained hashes, LRU.

The simulated engine uses it so that routing and load tests see the cache behaviour a real
vLLM replica would have: a prompt is served from cache only up to the first block that differs
from what this replica has seen, and a replica that sees too many different prefixes evicts.

What is modelled (after vLLM v1's ``KVCacheManager``/``BlockPool``):
- Only *full* blocks of ``block_size`` tokens are cached; a trailing partial block never is.
- A block's key is the hash of its parent block's key and its own token ids, so a block is
  reusable only after exactly the same prefix (the chain stops at the first miss).
- A request's ``cache_salt`` (its tenant's, ``GenerateRequest.cache_salt``) is hashed into its
  first block's key, as vLLM adds it to the first block's extra keys: every later key chains
  from it, so a salted prompt hits only blocks stored under the same salt, and an unsalted one
  only unsalted blocks.
- At most ``len(prompt) - 1`` prompt tokens are served from cache: the last prompt token is
  always computed, because its logits give the first output token.
- Eviction is least-recently-used, block by block. Within one sequence the deeper blocks are
  made older than the head blocks (vLLM frees a request's blocks tail first), so eviction eats a
  cold prefix from its end and never leaves an unreachable tail behind a missing head.

Events: given ``on_events``, the cache reports what it stores and evicts as vLLM's KV-cache
events do (``serve_app.engines.kv_events``): a ``BlockStored`` for the blocks a lookup hits
and for those an insert adds, each naming the request's session, a ``BlockRemoved`` for the
blocks evicted, an ``AllBlocksCleared`` on `clear`.

Tiers behind the GPU cache (both off by default):
- a **CPU tier** of ``cpu_capacity_tokens`` (vLLM's ``OffloadingConnector`` with its CPU
  backend): every block a request computes is written to it too (vLLM stores blocks as they are
  computed, not when the GPU evicts them), LRU on its own. A lookup that runs out of GPU blocks
  continues into the CPU tier: those blocks are *loaded* (``CacheHit.loaded_tokens``; the
  engine's time model charges them at its load rate) and become GPU blocks again when the
  request's prompt is inserted. Its events are vLLM's offloading events: a ``BlockStored`` with
  ``medium="CPU"`` and no session for the blocks written, a ``BlockRemoved`` with it for those
  the tier evicts;
- a **shared tier** (`SharedKVTier`, one object several caches hold: LMCache with a shared
  backend, Mooncake): every block a replica computes is written to it; a lookup that runs out
  of GPU and CPU blocks continues into it, and those blocks are *pulled*
  (``CacheHit.pulled_tokens``). It is the cluster's, not a replica's: no events. A store in
  another process (`SharedTier`: the simulated engine's on Ray,
  ``serve_app.engines.simulated.shared_tier``) is asked first, in one call, which of the
  prompt's blocks past the local tiers it holds (`PrefixKVCache.prefetch_shared`).

What is not: KV held by running requests does not reduce the capacity here (vLLM's pool is
shared between running requests and cached blocks), and hash collisions are ignored (Python's
64-bit tuple hash; vLLM uses sha256 only as an option).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

from serve_app.engines.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventSink,
)

# vLLM's medium of the CPU offloading tier's events (MEDIUM_CPU).
CPU_MEDIUM = "CPU"


def _stable_hash(text: str) -> int:
    """A 63-bit hash of ``text`` that is the same in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest()) >> 1


# Parent key of a sequence's first block. Keys must agree between processes (replicas on Ray
# share a tier by key): Python's str hash is salted per process, its int and tuple-of-int
# hashes are not, so the strings in a key (this root, a salt) enter it as `_stable_hash`es.
_ROOT_KEY = _stable_hash("serve_app.prefix_cache.root")


class SharedTier(Protocol):
    """What a cache needs of a shared tier: membership for a lookup (answered for the keys
    last passed to `prefetch` by a store in another process), writes and LRU refreshes."""

    block_size: int

    def __contains__(self, key: int) -> bool: ...

    def write(self, keys: Sequence[int]) -> None: ...

    def touch(self, keys: Sequence[int]) -> None: ...

    async def prefetch(self, keys: Sequence[int]) -> None: ...


class SharedKVTier:
    """A block store every replica's cache writes to and reads from (keys only), LRU."""

    def __init__(self, capacity_tokens: int, block_size: int = 16) -> None:
        if capacity_tokens < block_size:
            raise ValueError(f"capacity_tokens ({capacity_tokens}) must hold a block")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def write(self, keys: Sequence[int]) -> None:
        """Store (or refresh) one sequence's blocks, head newest, evicting the oldest."""
        _touch(self._blocks, keys)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def touch(self, keys: Sequence[int]) -> None:
        _touch(self._blocks, [key for key in keys if key in self._blocks])

    def held(self, keys: Sequence[int]) -> list[int]:
        """Those of ``keys`` the tier holds (no LRU refresh: a lookup refreshes what it pulls)."""
        return [key for key in keys if key in self._blocks]

    async def prefetch(self, keys: Sequence[int]) -> None:
        """Nothing to fetch: this tier is in the caches' own process."""


@dataclass(frozen=True)
class CacheHit:
    """What a lookup found: the keys of the prompt's leading blocks held in any tier, and of
    their tokens how many come from the CPU tier (loaded) and the shared one (pulled); the
    rest were on the GPU."""

    keys: list[int]
    tokens: int
    loaded_tokens: int = 0
    pulled_tokens: int = 0

    @property
    def gpu_tokens(self) -> int:
        return self.tokens - self.loaded_tokens - self.pulled_tokens


@dataclass(frozen=True)
class PrefixCacheStats:
    """A snapshot of the cache for metrics. Token counts are cumulative since creation."""

    block_size: int
    capacity_blocks: int
    used_blocks: int
    lookups: int
    queried_tokens: int
    hit_tokens: int
    inserted_blocks: int
    evicted_blocks: int
    # Of hit_tokens (every tier's), those loaded from the CPU tier and pulled from the shared.
    loaded_tokens: int = 0
    pulled_tokens: int = 0
    cpu_used_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from cache over prompt tokens looked up (0 before any lookup)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def usage(self) -> float:
        """Fraction of the capacity holding cached blocks."""
        return self.used_blocks / self.capacity_blocks


class PrefixKVCache:
    """Block-level prefix cache of one engine replica (token ids only, no tensors)."""

    def __init__(
        self,
        block_size: int = 16,
        capacity_tokens: int = 262_144,
        on_events: KVEventSink | None = None,
        cpu_capacity_tokens: int = 0,
        shared: SharedTier | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if capacity_tokens < block_size:
            raise ValueError(
                f"capacity_tokens ({capacity_tokens}) must hold a block ({block_size} tokens)"
            )
        if cpu_capacity_tokens and cpu_capacity_tokens < block_size:
            raise ValueError(f"cpu_capacity_tokens ({cpu_capacity_tokens}) must hold a block")
        if shared is not None and shared.block_size != block_size:
            raise ValueError("the shared tier's block_size must be the cache's")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self.cpu_capacity_blocks = cpu_capacity_tokens // block_size  # 0: no CPU tier
        self.shared = shared
        # The CPU tier's block keys, least recently used first.
        self._cpu: OrderedDict[int, None] = OrderedDict()
        self._loaded_tokens = 0
        self._pulled_tokens = 0
        # Block key -> None, least recently used first.
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._lookups = 0
        self._queried_tokens = 0
        self._hit_tokens = 0
        self._inserted_blocks = 0
        self._evicted_blocks = 0
        self._on_events = on_events

    @property
    def used_blocks(self) -> int:
        return len(self._blocks)

    def _iter_keys(
        self, token_ids: Sequence[int], known: Sequence[int] = (), salt: str | None = None
    ) -> Iterator[int]:
        """Chained keys of the full blocks of ``token_ids``, computed lazily.

        Lazy so that a lookup that misses early hashes one block, not the whole prompt.
        ``known`` are the keys of leading blocks already hashed (from `insert`): a sequence that
        grew is hashed from where it was left (its salt is in them already). ``salt`` goes
        into the first block's key only; the chain carries it to every later block.
        """
        yield from known
        size = self.block_size
        begin = len(known) * size
        tokens = tuple(token_ids[begin:])  # tuple slices are tuples: one copy per block
        parent = known[-1] if known else _ROOT_KEY
        for start in range(0, len(tokens) - size + 1, size):
            block = tokens[start : start + size]
            if begin + start == 0 and salt is not None:
                parent = hash((parent, block, _stable_hash(salt)))
            else:
                parent = hash((parent, block))
            yield parent

    def block_keys(self, token_ids: Sequence[int], salt: str | None = None) -> list[int]:
        """Keys of every full block of ``token_ids`` (for tests and routing experiments)."""
        return list(self._iter_keys(token_ids, salt=salt))

    def peek(self, token_ids: Sequence[int], salt: str | None = None) -> int:
        """Like `lookup` on the GPU tier alone, but changes neither the LRU order nor the
        stats."""
        return len(self._hit_keys(token_ids, salt)) * self.block_size

    def peek_hit(self, token_ids: Sequence[int], salt: str | None = None) -> CacheHit:
        """Like `lookup_hit` (every tier), but changes neither the LRU orders nor the stats."""
        return self._hit(token_ids, salt)

    async def prefetch_shared(self, token_ids: Sequence[int], salt: str | None = None) -> None:
        """Ask the shared tier, in one call, which of the prompt's blocks past those the GPU
        and CPU tiers hold it has, so that the `lookup_hit` that follows (with no await in
        between) reads a store in another process as it reads a local one."""
        if self.shared is None:
            return
        on_gpu = self._hit_keys(token_ids, salt)
        prompt = token_ids[: max(len(token_ids) - 1, 0)]
        keys = islice(self._iter_keys(prompt, on_gpu, salt), len(on_gpu), None)
        # `_hit` reads the CPU tier before the shared one: those blocks need no answer.
        beyond = [key for key in keys if key not in self._cpu]
        if beyond:
            await self.shared.prefetch(beyond)

    def lookup(self, token_ids: Sequence[int], salt: str | None = None) -> int:
        """Prompt tokens that would be served from cache; counts in stats and refreshes LRU.

        That is the leading full blocks present, within the first ``len(token_ids) - 1``
        tokens (the last prompt token is always computed, as in vLLM), stored under the same
        ``salt``.
        """
        return len(self.lookup_blocks(token_ids, salt=salt)) * self.block_size

    def lookup_blocks(
        self, token_ids: Sequence[int], session_id: str | None = None, salt: str | None = None
    ) -> list[int]:
        """`lookup` returning the keys of the blocks hit, to pass to `insert` as known keys.
        The hit blocks are reported stored for ``session_id``, as vLLM reports a prefix hit."""
        return self.lookup_hit(token_ids, session_id, salt).keys

    def lookup_hit(
        self, token_ids: Sequence[int], session_id: str | None = None, salt: str | None = None
    ) -> CacheHit:
        """`lookup_blocks` through every tier: the GPU blocks hit (reported stored for
        ``session_id``), then those the CPU tier and the shared tier hold (to load and pull;
        `insert` makes them GPU blocks)."""
        hit = self._hit(token_ids, salt)
        size = self.block_size
        on_gpu = hit.keys[: hit.gpu_tokens // size]
        self._touch(on_gpu)
        if on_gpu:
            self._emit(BlockStored(tuple(on_gpu), None, size, session_id))
        beyond = hit.keys[len(on_gpu) :]
        _touch(self._cpu, [key for key in beyond if key in self._cpu])
        if self.shared is not None:
            self.shared.touch(beyond)
        self._lookups += 1
        self._queried_tokens += len(token_ids)
        self._hit_tokens += hit.tokens
        self._loaded_tokens += hit.loaded_tokens
        self._pulled_tokens += hit.pulled_tokens
        return hit

    def _hit(self, token_ids: Sequence[int], salt: str | None) -> CacheHit:
        """The leading blocks held on the GPU, then on, each from the cheapest tier holding
        it (the CPU tier before the shared one), to the first held nowhere."""
        keys = self._hit_keys(token_ids, salt)
        loaded = pulled = 0
        if self._cpu or self.shared is not None:
            prompt = token_ids[: max(len(token_ids) - 1, 0)]
            on_gpu = len(keys)
            for key in islice(self._iter_keys(prompt, tuple(keys), salt), on_gpu, None):
                if key in self._cpu:
                    loaded += 1
                elif self.shared is not None and key in self.shared:
                    pulled += 1
                else:
                    break
                keys.append(key)
        size = self.block_size
        return CacheHit(keys, len(keys) * size, loaded * size, pulled * size)

    def _hit_keys(self, token_ids: Sequence[int], salt: str | None = None) -> list[int]:
        hits: list[int] = []
        for key in self._iter_keys(token_ids[: max(len(token_ids) - 1, 0)], salt=salt):
            if key not in self._blocks:
                break
            hits.append(key)
        return hits

    def insert(
        self,
        token_ids: Sequence[int],
        known_keys: Sequence[int] = (),
        session_id: str | None = None,
        salt: str | None = None,
    ) -> list[int]:
        """Cache the full blocks of a computed sequence (prompt + output), evicting LRU blocks.

        Returns the sequence's block keys. ``known_keys`` are keys of its leading blocks already
        computed (from `lookup_blocks`, or an earlier `insert` of a shorter version of the same
        sequence, under the same ``salt``), so a long prompt is hashed once per request rather
        than three times.
        """
        if len(known_keys) * self.block_size > len(token_ids):
            raise ValueError("known_keys cover more blocks than token_ids has")
        keys = list(self._iter_keys(token_ids, known_keys, salt))
        new = [index for index, key in enumerate(keys) if key not in self._blocks]
        self._inserted_blocks += len(new)
        self._touch(keys)
        if new and self._on_events is not None:
            # New blocks of one sequence follow its cached head: one run from the first new one.
            first = new[0]
            parent = keys[first - 1] if first else None
            self._emit(BlockStored(tuple(keys[first:]), parent, self.block_size, session_id))
        if self.cpu_capacity_blocks:
            self._write_to_cpu(keys)
        if self.shared is not None:
            self.shared.write(keys)
        self._evict()
        return keys

    def _write_to_cpu(self, keys: list[int]) -> None:
        """Write a computed sequence's blocks to the CPU tier (those it lacks: vLLM's
        connector stores each block once), refresh the rest, evict its LRU blocks."""
        new = [index for index, key in enumerate(keys) if key not in self._cpu]
        _touch(self._cpu, keys)
        if new:
            first = new[0]
            parent = keys[first - 1] if first else None
            written = tuple(keys[first:])
            self._emit(BlockStored(written, parent, self.block_size, medium=CPU_MEDIUM))
        evicted = []
        while len(self._cpu) > self.cpu_capacity_blocks:
            evicted.append(self._cpu.popitem(last=False)[0])
        if evicted:
            self._emit(BlockRemoved(tuple(evicted), medium=CPU_MEDIUM))

    def _touch(self, keys: list[int]) -> None:
        _touch(self._blocks, keys)

    def _evict(self) -> None:
        evicted = []
        while len(self._blocks) > self.capacity_blocks:
            evicted.append(self._blocks.popitem(last=False)[0])
        self._evicted_blocks += len(evicted)
        if evicted:
            self._emit(BlockRemoved(tuple(evicted)))

    def clear(self) -> None:
        """Drop every block, the CPU tier's too (like vLLM's ``reset_prefix_cache``, which
        resets the connector's); stats are kept. A shared tier is the cluster's: kept."""
        self._blocks.clear()
        self._cpu.clear()
        self._emit(AllBlocksCleared())

    def _emit(self, event: KVEvent) -> None:
        if self._on_events is not None:
            self._on_events((event,))

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(
            block_size=self.block_size,
            capacity_blocks=self.capacity_blocks,
            used_blocks=len(self._blocks),
            lookups=self._lookups,
            queried_tokens=self._queried_tokens,
            hit_tokens=self._hit_tokens,
            inserted_blocks=self._inserted_blocks,
            evicted_blocks=self._evicted_blocks,
            loaded_tokens=self._loaded_tokens,
            pulled_tokens=self._pulled_tokens,
            cpu_used_blocks=len(self._cpu),
        )


def _touch(blocks: OrderedDict[int, None], keys: Sequence[int]) -> None:
    """Make ``keys`` (one sequence's blocks, head first) the most recently used in ``blocks``.

    The head block ends up newest, so eviction takes a sequence's deepest blocks first.
    """
    for key in reversed(keys):
        blocks[key] = None
        blocks.move_to_end(key)
