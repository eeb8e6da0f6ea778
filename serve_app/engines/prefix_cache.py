"""A model of vLLM's automatic prefix cache: full KV blocks keyed by chained hashes, LRU.

A block's key is the hash of its tokens and its parent's key, so a block is reusable only
after the same prefix. Only full blocks are cached, and (as in vLLM) the last prompt token is
always computed, so a request never gets its whole prompt from cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class CacheStats:
    queried_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class PrefixKVCache:
    def __init__(self, block_size: int = 16, capacity_tokens: int = 262_144) -> None:
        if block_size <= 0 or capacity_tokens < block_size:
            raise ValueError("need block_size > 0 and capacity_tokens >= block_size")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()  # key -> None, oldest first
        self.stats = CacheStats()

    @property
    def used_blocks(self) -> int:
        return len(self._blocks)

    def _block_keys(self, token_ids: Sequence[int]) -> list[int]:
        keys, parent = [], 0
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            parent = hash((parent, tuple(token_ids[start : start + self.block_size])))
            keys.append(parent)
        return keys

    def lookup(self, prompt_token_ids: Sequence[int]) -> int:
        """Prompt tokens served from cache (leading cached blocks), and count them in stats."""
        # The last token is always recomputed: it produces the first output token's logits.
        keys = self._block_keys(prompt_token_ids[: max(len(prompt_token_ids) - 1, 0)])
        hit_blocks = 0
        for key in keys:
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            hit_blocks += 1
        cached = hit_blocks * self.block_size
        self.stats.queried_tokens += len(prompt_token_ids)
        self.stats.hit_tokens += cached
        return cached

    def insert(self, token_ids: Sequence[int]) -> None:
        """Cache the full blocks of a finished sequence (prompt + output), evicting LRU."""
        for key in self._block_keys(token_ids):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
