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

What is not: KV held by running requests does not reduce the capacity here (vLLM's pool is
shared between running requests and cached blocks), and hash collisions are ignored (Python's
64-bit tuple hash; vLLM uses sha256 only as an option).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from serve_app.engines.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventSink,
)

# Parent key of a sequence's first block.
_ROOT_KEY = hash("serve_app.prefix_cache.root")


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
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if capacity_tokens < block_size:
            raise ValueError(
                f"capacity_tokens ({capacity_tokens}) must hold a block ({block_size} tokens)"
            )
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
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
                parent = hash((parent, block, salt))
            else:
                parent = hash((parent, block))
            yield parent

    def block_keys(self, token_ids: Sequence[int], salt: str | None = None) -> list[int]:
        """Keys of every full block of ``token_ids`` (for tests and routing experiments)."""
        return list(self._iter_keys(token_ids, salt=salt))

    def peek(self, token_ids: Sequence[int], salt: str | None = None) -> int:
        """Like `lookup`, but changes neither the LRU order nor the stats."""
        return len(self._hit_keys(token_ids, salt)) * self.block_size

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
        hits = self._hit_keys(token_ids, salt)
        self._touch(hits)
        if hits:
            self._emit(BlockStored(tuple(hits), None, self.block_size, session_id))
        self._lookups += 1
        self._queried_tokens += len(token_ids)
        self._hit_tokens += len(hits) * self.block_size
        return hits

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
        self._evict()
        return keys

    def _touch(self, keys: list[int]) -> None:
        """Make ``keys`` (one sequence's blocks, head first) the most recently used.

        The head block ends up newest, so eviction takes a sequence's deepest blocks first.
        """
        blocks = self._blocks
        for key in reversed(keys):
            blocks[key] = None
            blocks.move_to_end(key)

    def _evict(self) -> None:
        evicted = []
        while len(self._blocks) > self.capacity_blocks:
            evicted.append(self._blocks.popitem(last=False)[0])
        self._evicted_blocks += len(evicted)
        if evicted:
            self._emit(BlockRemoved(tuple(evicted)))

    def clear(self) -> None:
        """Drop every block (like vLLM's ``reset_prefix_cache``); stats are kept."""
        self._blocks.clear()
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
        )
