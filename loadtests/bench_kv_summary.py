"""What an engine replica's KV summary (serve_app/routing/kv_summary.py) keeps, and costs, after
many conversations that share a prefix the cache never evicts.

Each conversation stores the shared two-block prompt (a system prompt) and three blocks of its
own, which the cache evicts ``--evict-after`` conversations later, as a replica under steady
traffic does; the shared blocks stay. Printed: the conversations the summary holds, the memory
it keeps (tracemalloc), the CPU of feeding it the events and of one report (the engine replica
reports every second), with the summary's bound (``max_reported``, 4,096) and without one (a
bound above the number of conversations: nothing is ever forgotten, as before issue 38).

    PYTHONPATH=. python loadtests/bench_kv_summary.py [--conversations 100000]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from serve_app.engines.kv_events import BlockRemoved, BlockStored, KVEvent
from serve_app.routing.directory import DEFAULT_MAX_REPORTED
from serve_app.routing.kv_summary import HeldPrefixes

SHARED = (0, 1)  # the shared prompt's two block hashes
BLOCK_SIZE = 16


def own_blocks(conversation: int) -> tuple[int, ...]:
    return tuple(1000 + 4 * conversation + block for block in range(3))


def events_of(conversation: int, evict_after: int) -> list[KVEvent]:
    session = f"conversation-{conversation}"
    events: list[KVEvent] = [
        BlockStored(SHARED, None, BLOCK_SIZE, session),  # its prefix hit on the shared prompt
        BlockStored(own_blocks(conversation), SHARED[-1], BLOCK_SIZE, session),
    ]
    if conversation >= evict_after:
        events.append(BlockRemoved(own_blocks(conversation - evict_after)))
    return events


def measure(bound: int, conversations: int, evict_after: int) -> str:
    tracemalloc.start()
    held = HeldPrefixes(max_reported=bound)
    start = time.process_time()
    for conversation in range(conversations):
        held(events_of(conversation, evict_after))
    feed_s = time.process_time() - start
    memory, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    start = time.process_time()
    for _ in range(10):
        report = held.report()
    report_s = (time.process_time() - start) / 10
    return (
        f"bound {bound:>9,}: {len(held):>7,} conversations held, {memory / 1e6:6.1f} MB, "
        f"events {feed_s / conversations * 1e6:5.1f} us CPU per conversation, "
        f"one report ({len(report):,} entries) {report_s * 1e3:6.2f} ms CPU"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--evict-after", type=int, default=50)
    args = parser.parse_args()
    print(f"{args.conversations:,} conversations sharing a never-evicted two-block prompt")
    for bound in (DEFAULT_MAX_REPORTED, args.conversations + 1):
        print(measure(bound, args.conversations, args.evict_after))


if __name__ == "__main__":
    main()
