"""What an engine replica holds in its prefix cache, per conversation, from its KV-cache events.

The engine deployment subscribes to its engine's KV-cache events (``serve_app.engines.
kv_events``: vLLM's, or the simulated engine's cache model) and keeps this summary, which goes
in its routing-stats report (``HELD_KEY``): for each conversation it holds blocks of, how many
prompt tokens of it are cached. A router then knows what a turn would find cached on each
replica, rather than assuming the conversation's home still holds it: under KV-cache pressure
the home may have evicted the prefix it would be sent back for.

The bookkeeping, from the events alone:

- ``BlockStored`` names the session that stored, or found cached, each block: the block is
  added to that conversation's blocks (a block shared by several conversations, like the
  system prompt, counts for each);
- ``BlockRemoved`` (no session) takes the block from every conversation that had it;
- ``AllBlocksCleared`` forgets everything;
- ``EventsLost`` (batches the engine published never arrived, and its replay buffer no longer
  had them) forgets everything too: a lost ``BlockRemoved`` would leave blocks counted that are
  gone, and a router must not send a turn for a hit that is not there. The summary resyncs from
  the events that follow: a conversation's next turn on the replica reports the blocks it finds
  cached (a ``BlockStored`` for its prefix hit) and those it adds. Until then the replica
  reports nothing held for it, so a router predicts a whole prefill there (the safe side).

A conversation's held tokens are its cached blocks times the block size. vLLM evicts a cold
sequence tail first, so the blocks left are its prefix, and the count is what a turn would hit.
Only one KV-cache group is counted (gpt-oss has a full-attention and a sliding-window group,
each with its own events): the first full-attention one seen, or every event from an engine
that names no group.

Conversations are keyed by the routing key's ``stable_hash``, as in the conversations report
(``serve_app.routing.directory``). The summary is bounded: it holds the ``max_reported``
conversations that stored (or found cached) a block most recently, the ones it reports, and
forgets the least recently stored one to make room for another. Without the bound a block that
is never evicted (a system prompt every conversation shares) would keep every conversation that
ever touched it, and the summary would grow for the replica's lifetime. A forgotten
conversation whose blocks are still cached is reported as holding nothing (a router predicts a
whole prefill there, the safe side) until its next turn on the replica reports its prefix hit.
Memory: at most ``max_reported`` conversations, each with at most the cache's blocks, and no
block entry without a conversation. Pure Python, no Ray.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence

from serve_app.engines.kv_events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventsLost,
    KVEvent,
)
from serve_app.routing.directory import DEFAULT_MAX_REPORTED
from serve_app.routing.ring import stable_hash

HELD_KEY = "held_tokens"  # {conversation hash: prompt tokens cached on the GPU}
# {conversation hash: prompt tokens cached only in the replica's CPU tier (vLLM's offloading
# connector, the simulated engine's CPU tier)}: same keys and bound as HELD_KEY.
CPU_HELD_KEY = "cpu_held_tokens"
# vLLM's `medium` strings (its MEDIUM_GPU, and the CPU offloading tier's); None reads as GPU.
GPU_MEDIUM = "GPU"
CPU_MEDIUM = "CPU"
KV_EVENTS_KEY = "kv_events"  # {event name: events seen}
# vLLM's KVCacheSpecKind values of groups whose blocks are a whole prefix.
_FULL_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


class HeldPrefixes:
    """On an engine replica: its prefix cache per conversation, from its KV-cache events.
    An instance is a ``KVEventSink``: the engine calls it with each batch."""

    def __init__(self, max_reported: int = DEFAULT_MAX_REPORTED) -> None:
        if max_reported <= 0:
            raise ValueError("max_reported must be positive")
        self.max_reported = max_reported
        self.event_counts: Counter[str] = Counter()
        self._owners: dict[BlockHash, set[int]] = {}  # block -> conversations held using it
        # Conversation -> its cached blocks, by last store (or prefix hit), oldest first.
        self._held: OrderedDict[int, set[BlockHash]] = OrderedDict()
        self._block_size = 0
        self._group: int | None = None  # the KV-cache group counted, once one is seen

    def __call__(self, events: Sequence[KVEvent]) -> None:
        for event in events:
            self.event_counts[type(event).__name__] += 1
            match event:
                case BlockStored():
                    self._stored(event)
                case BlockRemoved():
                    if self._counts(event.group_idx):
                        self._removed(event.block_hashes)
                case AllBlocksCleared() | EventsLost():
                    self._owners.clear()
                    self._held.clear()

    def __len__(self) -> int:
        """Conversations held (at most ``max_reported``)."""
        return len(self._held)

    def held_tokens(self, session_id: str) -> int:
        return len(self._held.get(stable_hash(session_id), ())) * self._block_size

    def cpu_report(self) -> dict[int, int]:
        """Tokens held only in the replica's CPU tier, per conversation (keys as `report`)."""
        return {}

    def report(self) -> dict[int, int]:
        """Held tokens of the conversations held (the most recently stored ones, at most
        ``max_reported``), the least recently stored first."""
        size = self._block_size
        return {conversation: len(blocks) * size for conversation, blocks in self._held.items()}

    def _counts(self, group_idx: int | None) -> bool:
        return group_idx is None or group_idx == self._group

    def _stored(self, event: BlockStored) -> None:
        group = event.group_idx
        if group is not None and self._group is None:
            if event.kv_cache_spec_kind not in (None, *_FULL_KINDS):
                return
            self._group = group
        if not self._counts(group) or event.session_id is None:
            return
        self._block_size = max(self._block_size, event.block_size)
        conversation = stable_hash(event.session_id)
        blocks = self._held.get(conversation)
        if blocks is None:
            if not event.block_hashes:
                return
            blocks = self._held[conversation] = set()
        for block in event.block_hashes:
            if block not in blocks:
                blocks.add(block)
                self._owners.setdefault(block, set()).add(conversation)
        self._held.move_to_end(conversation)
        while len(self._held) > self.max_reported:
            forgotten, its_blocks = self._held.popitem(last=False)
            self._disown(forgotten, its_blocks)

    def _disown(self, conversation: int, blocks: Iterable[BlockHash]) -> None:
        """Take a forgotten conversation from its blocks' owners; a block left with none goes
        too (a later BlockRemoved of it has nothing to debit)."""
        for block in blocks:
            owners = self._owners[block]
            owners.discard(conversation)
            if not owners:
                del self._owners[block]

    def _removed(self, blocks: Sequence[BlockHash]) -> None:
        for block in blocks:
            for conversation in self._owners.pop(block, ()):
                held = self._held[conversation]
                held.discard(block)
                if not held:
                    del self._held[conversation]
