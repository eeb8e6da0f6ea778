"""What an engine replica reports of its prefill queue (routing/prefill.py, through the
`ReplicaReporter` the deployment and the routing replay share): a turn of a conversation the
replica holds none of is estimated by the shared prefix such turns found cached."""

from __future__ import annotations

from serve_app.engines.kv_events import BlockStored
from serve_app.routing.prefill import QUEUED_AHEAD_KEY, QUEUED_KEY, SHARED_KEY
from serve_app.routing.replica_report import ReplicaReporter

SHARED = 4800  # Codex's developer prompt, cached on every replica that served any conversation


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _served_cold(reporter: ReplicaReporter, request_id: str, prompt: int, computed: int) -> None:
    """A first turn arrives (the replica holds nothing of its conversation) and the engine
    counts ``computed`` uncached tokens at its first token."""
    reporter.arrived(request_id, request_id, prompt)
    reporter.first_token(request_id, computed, reporter.now())
    reporter.ended(request_id)


def test_a_cold_turn_is_estimated_by_the_shared_prefix_the_engine_counted() -> None:
    reporter = ReplicaReporter("r", clock=Clock())
    # Before any cold turn was counted, the whole prompt is the estimate.
    reporter.arrived("first", "first", 4860)
    assert reporter.report()[QUEUED_KEY] == 4860
    assert SHARED_KEY not in reporter.report()
    reporter.first_token("first", 60, reporter.now())
    reporter.ended("first")
    _served_cold(reporter, "second", 4900, 100)
    _served_cold(reporter, "third", 5000, 2000)  # an odd one: the median is not moved by it
    assert reporter.report()[SHARED_KEY] == SHARED
    # A new conversation's first turn now counts what it will compute, not its whole prompt.
    reporter.arrived("new", "new", 4870)
    assert reporter.report()[QUEUED_KEY] == 70
    # A conversation the replica holds (by its KV events) is estimated by what it holds.
    blocks = tuple(hash(("held", index)) for index in range(5900 // 16))
    reporter.held([BlockStored(blocks, None, 16, "held")])
    reporter.arrived("warm", "held", 6000)
    assert reporter.report()[QUEUED_KEY] == 70 + 6000 - 5888


def test_a_prompt_shorter_than_the_shared_prefix_still_computes_a_token() -> None:
    reporter = ReplicaReporter("r", clock=Clock())
    _served_cold(reporter, "a", 4860, 60)
    reporter.arrived("short", "short", 100)
    assert reporter.report()[QUEUED_KEY] == 1


def test_a_turn_without_the_engines_count_teaches_nothing() -> None:
    """An engine that does not say what it computed (None) leaves the estimate as it was."""
    reporter = ReplicaReporter("r", clock=Clock())
    reporter.arrived("a", "a", 4860)
    reporter.first_token("a", None, reporter.now())
    assert SHARED_KEY not in reporter.report()


def test_the_prefill_in_progress_counts_what_it_has_left() -> None:
    """Prefills run in arrival order: the first waiting request has been computing since it
    arrived (or since the first token before it), at the measured rate; those behind it
    count whole. Before, a long prefill counted whole until its first token."""
    clock = Clock()
    reporter = ReplicaReporter("r", clock=clock)
    reporter.arrived("measured", "a", 5000)
    clock.now += 1
    reporter.first_token("measured", 5000, clock())  # 5,000 tokens/s
    reporter.ended("measured")
    clock.now += 0.2
    reporter.arrived("long", "b", 5000)
    reporter.arrived("behind", "c", 1000)
    assert reporter.report()[QUEUED_KEY] == 6000
    clock.now += 0.5
    assert reporter.report()[QUEUED_KEY] == 2500 + 1000
    clock.now += 0.5
    reporter.first_token("long", 5000, clock())  # on time: still 5,000 tokens/s
    clock.now += 0.1  # the one behind began at the first token before it
    assert reporter.report()[QUEUED_KEY] == 500
    clock.now += 1  # overdue: it counts nothing more than done
    assert reporter.report()[QUEUED_KEY] == 0


def test_the_queue_ahead_of_each_tier_is_what_a_turn_of_it_would_wait_for() -> None:
    """Issue 49: the engine serves the earliest deadline first, so a turn arriving now waits
    only for the queued requests due no later than it would be. Each rank the replica has seen
    gets that figure, aging included: a default request queued longer than the deadlines'
    difference counts ahead of a priority turn."""
    clock = Clock()
    reporter = ReplicaReporter("r", clock=clock)
    reporter.arrived("flex", "f", 8000, deadline_s=60.0, priority=1)
    reporter.arrived("default", "d", 2000, deadline_s=5.0, priority=0)
    reporter.arrived("urgent", "u", 500, deadline_s=0.0, priority=-1)
    report = reporter.report()
    assert report[QUEUED_KEY] == 10_500
    assert report[QUEUED_AHEAD_KEY] == {"-1": 500, "0": 2500, "1": 10_500}
    clock.now += 6  # the default request is past the 5 s between the two deadlines
    assert reporter.report()[QUEUED_AHEAD_KEY] == {"-1": 2500, "0": 2500, "1": 10_500}
    reporter.ended("flex")
    assert reporter.report()[QUEUED_AHEAD_KEY]["1"] == 2500
