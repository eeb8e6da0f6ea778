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

Tiers (vLLM's ``medium`` on each event; None reads as the GPU pool). An engine with a CPU tier
behind its GPU cache (vLLM's ``OffloadingConnector``, the simulated engine's
``cpu_kv_cache_tokens``) also publishes the CPU copies: a ``BlockStored`` with ``medium="CPU"``
as the connector writes a computed block out (no session: the copy is credited to the
conversations that hold the block on the GPU), a ``BlockRemoved`` with it when the CPU tier
evicts one. Each conversation has its GPU blocks and its CPU copies: ``held_tokens`` counts
the GPU ones (a turn finds them cached, as before), ``cpu_held_tokens`` those held only on the
CPU (a turn loads them, much faster than it computes them). A block on both counts as GPU; a
GPU removal leaves a CPU copy counted and a CPU removal a GPU one; the connector may announce
a CPU block once per chunk holding it, so CPU copies are reference-counted as vLLM asks. A
conversation stays while it has a block in either tier. Another medium (vLLM's ``STORAGE``)
is not counted.

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
Memory: at most ``max_reported`` conversations, each with at most the cache's blocks, no
block entry without a conversation, and a count per block in the CPU tier. Pure Python, no Ray.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence

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
        # Block -> conversations held using it (on the GPU or in the CPU tier).
        self._owners: dict[BlockHash, set[int]] = {}
        # Conversation -> its blocks on the GPU, by last store (or prefix hit), oldest first.
        # Empty only while the conversation has blocks in the CPU tier alone.
        self._held: OrderedDict[int, set[BlockHash]] = OrderedDict()
        # Conversation -> its blocks with a copy in the CPU tier (some also on the GPU).
        self._cpu: dict[int, set[BlockHash]] = {}
        # CPU-tier residency of each block: vLLM's offloading connector may announce a block
        # once per chunk that holds it, and asks consumers to count the announcements.
        self._cpu_refs: Counter[BlockHash] = Counter()
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
                        self._removed(event.block_hashes, _tier(event.medium))
                case AllBlocksCleared() | EventsLost():
                    self._owners.clear()
                    self._held.clear()
                    self._cpu.clear()
                    self._cpu_refs.clear()

    def __len__(self) -> int:
        """Conversations held (at most ``max_reported``)."""
        return len(self._held)

    def held_tokens(self, session_id: str) -> int:
        """Prompt tokens of the conversation on the GPU (a turn finds them cached)."""
        return len(self._held.get(stable_hash(session_id), ())) * self._block_size

    def cpu_held_tokens(self, session_id: str) -> int:
        """Prompt tokens of the conversation held only in the CPU tier (a turn loads them)."""
        conversation = stable_hash(session_id)
        return self._cpu_only(conversation) * self._block_size

    def report(self) -> dict[int, int]:
        """Held tokens on the GPU of the conversations held (the most recently stored ones,
        at most ``max_reported``), the least recently stored first."""
        size = self._block_size
        return {
            conversation: len(blocks) * size
            for conversation, blocks in self._held.items()
            if blocks
        }

    def cpu_report(self) -> dict[int, int]:
        """Tokens held only in the replica's CPU tier, per conversation (keys as `report`; a
        block on the GPU and in the CPU tier counts on the GPU only)."""
        size = self._block_size
        only = {conversation: self._cpu_only(conversation) for conversation in self._held}
        return {conversation: blocks * size for conversation, blocks in only.items() if blocks}

    def _cpu_only(self, conversation: int) -> int:
        cpu = self._cpu.get(conversation)
        if not cpu:
            return 0
        return len(cpu - self._held.get(conversation, set()))

    def _counts(self, group_idx: int | None) -> bool:
        return group_idx is None or group_idx == self._group

    def _stored(self, event: BlockStored) -> None:
        group = event.group_idx
        if group is not None and self._group is None:
            if event.kv_cache_spec_kind not in (None, *_FULL_KINDS):
                return
            self._group = group
        if not self._counts(group):
            return
        tier = _tier(event.medium)
        if tier == CPU_MEDIUM:
            self._stored_on_cpu(event)
            return
        if tier != GPU_MEDIUM or event.session_id is None:
            return
        self._block_size = max(self._block_size, event.block_size)
        conversation = stable_hash(event.session_id)
        blocks = self._held.get(conversation)
        if blocks is None:
            if not event.block_hashes:
                return
            blocks = self._held[conversation] = set()
        cpu = self._cpu_refs
        for block in event.block_hashes:
            if block not in blocks:
                blocks.add(block)
                self._owners.setdefault(block, set()).add(conversation)
            if cpu.get(block):  # a copy stays in the CPU tier when the GPU evicts this one
                self._cpu.setdefault(conversation, set()).add(block)
        self._held.move_to_end(conversation)
        self._bound()

    def _stored_on_cpu(self, event: BlockStored) -> None:
        """vLLM's offloading connector writes the blocks a request computed to the CPU tier
        and names no session: the copies are the blocks' GPU owners' (an engine that does
        name the session credits that conversation too)."""
        self._block_size = max(self._block_size, event.block_size)
        conversation = None if event.session_id is None else stable_hash(event.session_id)
        if conversation is not None and conversation not in self._held and event.block_hashes:
            self._held[conversation] = set()
        for block in event.block_hashes:
            self._cpu_refs[block] += 1
            owners = self._owners.get(block, set())
            if conversation is not None:
                owners = self._owners.setdefault(block, owners)
                owners.add(conversation)
            for owner in owners:
                self._cpu.setdefault(owner, set()).add(block)
        if conversation is not None and conversation in self._held:
            self._held.move_to_end(conversation)
            self._bound()

    def _bound(self) -> None:
        while len(self._held) > self.max_reported:
            forgotten, its_blocks = self._held.popitem(last=False)
            self._disown(forgotten, its_blocks | self._cpu.pop(forgotten, set()))

    def _disown(self, conversation: int, blocks: Iterable[BlockHash]) -> None:
        """Take a forgotten conversation from its blocks' owners; a block left with none goes
        too (a later BlockRemoved of it has nothing to debit)."""
        for block in blocks:
            owners = self._owners[block]
            owners.discard(conversation)
            if not owners:
                del self._owners[block]

    def _removed(self, blocks: Sequence[BlockHash], tier: str | None) -> None:
        """A GPU removal leaves a block's CPU copy counted, and a CPU removal (the last of
        its announcements) its GPU copy; another medium's (vLLM's STORAGE) is not counted."""
        if tier == CPU_MEDIUM:
            gone = []
            for block in blocks:
                refs = self._cpu_refs.get(block, 0) - 1
                if refs > 0:
                    self._cpu_refs[block] = refs
                    continue
                self._cpu_refs.pop(block, None)
                gone.append(block)
            self._drop(gone, self._cpu)
        elif tier == GPU_MEDIUM:
            self._drop(blocks, self._held)

    def _drop(self, blocks: Iterable[BlockHash], tier: Mapping[int, set[BlockHash]]) -> None:
        """Take ``blocks`` from their conversations' sets in ``tier``; a conversation left
        with none of them in any tier no longer owns them, one left with nothing is gone."""
        for block in blocks:
            owners = self._owners.get(block)
            if not owners:
                continue
            for conversation in list(owners):
                held = tier.get(conversation)
                if held is None or block not in held:
                    continue
                held.discard(block)
                gpu, cpu = self._held[conversation], self._cpu.get(conversation, set())
                if block not in gpu and block not in cpu:
                    owners.discard(conversation)
                if not cpu:
                    self._cpu.pop(conversation, None)
                if not gpu and not cpu:
                    del self._held[conversation]
            if not owners:
                del self._owners[block]


def _tier(medium: str | None) -> str | None:
    """The tier an event's ``medium`` names: GPU (None reads as the GPU pool), CPU, or None
    for a medium not counted (vLLM's STORAGE: a file system behind the CPU tier)."""
    if medium is None or medium == GPU_MEDIUM:
        return GPU_MEDIUM
    return CPU_MEDIUM if medium == CPU_MEDIUM else None
