"""The replay's model of vLLM's chunked prefill (loadtests/sim_steps.py): what a step takes and
when a prefill's first token comes, which the routing study's engine-scheduling rows rest on."""

from __future__ import annotations

import sys

from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
from sim_steps import SteppedPrefill


def run_to_idle(queue: SteppedPrefill, now: float = 0.0) -> dict[tuple[int, int], float]:
    """Steps until nothing is left; each request's prefill end."""
    ends: dict[tuple[int, int], float] = {}
    step_ends = queue.start_step(now)
    while step_ends is not None:
        for request in queue.end_step():
            ends[request] = step_ends
        step_ends = queue.start_step(step_ends)
    return ends


def test_a_capped_long_prefill_shares_each_step_with_a_short_one() -> None:
    queue = SteppedPrefill(max_batched_tokens=8192, long_prefill_tokens=100, tokens_per_s=1000)
    queue.add((0, 0), 1000, 0)
    queue.add((1, 0), 50, 0)
    ends = run_to_idle(queue)
    # Step one: 100 of the long one and all 50 of the short one.
    assert ends[(1, 0)] == 0.15
    # Then the long one alone, uncapped: its remaining 900 in one step.
    assert ends[(0, 0)] == 1.05


def test_without_a_cap_a_step_takes_what_is_waiting_and_ends_together() -> None:
    queue = SteppedPrefill(max_batched_tokens=8192, long_prefill_tokens=0, tokens_per_s=1000)
    queue.add((0, 0), 1000, 0)
    queue.add((1, 0), 50, 0)
    assert run_to_idle(queue) == {(0, 0): 1.05, (1, 0): 1.05}


def test_the_budget_bounds_a_step() -> None:
    queue = SteppedPrefill(max_batched_tokens=600, long_prefill_tokens=0, tokens_per_s=1000)
    queue.add((0, 0), 1000, 0)
    assert run_to_idle(queue) == {(0, 0): 1.0}
    assert queue.start_step(1.0) is None


def test_one_at_a_time_takes_the_fewest_uncached_first_once_the_running_one_ends() -> None:
    queue = SteppedPrefill(max_batched_tokens=0, long_prefill_tokens=0, tokens_per_s=1000)
    queue.add((0, 0), 500, 500)
    assert queue.start_step(0.0) == 0.5  # started alone: it runs to its end
    queue.add((1, 0), 400, 400)
    queue.add((2, 0), 100, 100)
    assert queue.end_step() == [(0, 0)]
    assert queue.start_step(0.5) == 0.6  # the shorter of the two waiting ones first
    assert queue.end_step() == [(2, 0)]
    assert queue.start_step(0.6) == 1.0
    assert queue.end_step() == [(1, 0)]


def test_a_full_hit_still_computes_the_last_token() -> None:
    queue = SteppedPrefill(max_batched_tokens=8192, long_prefill_tokens=0, tokens_per_s=1000)
    queue.add((0, 0), 0, 0)
    assert run_to_idle(queue) == {(0, 0): 0.001}
