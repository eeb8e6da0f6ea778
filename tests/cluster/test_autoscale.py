"""The engine autoscaled under load, end to end (issue 47): the locust replay of multi-turn Codex
sessions (loadtests/scaling.py) against the engine deployment autoscaled by the project's policy
(serve_app/serving/engine/autoscaling.py, ``scaling.AUTOSCALING``: delays of seconds), on the
cluster's worker node.

The load (``scaling.SHAPE``): 3 users, then 12 (the engine must grow from its minimum, 1, to 3
replicas: 3 requests generating per replica is its target), then 5 while replicas are stopped
under it (each has conversations homed on it: their next turns move), then none (down to 1).
The same load then runs on a fixed-size engine (``scaling.FIXED_REPLICAS``, 2, as the rolling
upgrade's first case runs next), for the hit rate to compare.

- No turn fails or hangs, in either run, while replicas start and drain: every turn ends
  ``response.completed`` (loadtests/outcomes.py's ``acked``).
- It scaled: 3 replicas asked for under the high load (and running before the load ended),
  fewer while the lower load still ran (a replica drained with conversations on it), its
  minimum after.
- A conversation's cache survives the scale events: the token-weighted hit rate is within
  ``HIT_RATE_MARGIN`` of the fixed-size run's (and above ``HIT_RATE_FLOOR``, what the replay
  gets with affinity at all).

The run's picture (replicas, TTFT p90, hit rate over time) and CSV are written to the test's
temporary folder; the load-test mode (``python loadtests/scaling.py autoscale``) makes the same
from the command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.support import REPO
from tests.support.cluster import ClusterApp, stopping

sys.path.insert(0, str(REPO / "loadtests"))
import scaling
import timeline
from load_shape import parse_shape

# How far below the fixed-size run's hit rate the autoscaled run may fall (token-weighted):
# a conversation homed on a replica stopped under it loses its cache once (its next turn is a
# whole prefill elsewhere); the rest keep theirs. Measured: 0.924 against 0.934 (the stage),
# 0.929 against 0.936 (the load-test mode).
HIT_RATE_MARGIN = 0.03
# Below this, affinity itself is lost (each turn's prefix recomputed wherever it lands).
HIT_RATE_FLOOR = 0.85


def test_the_engine_scales_up_and_down_under_the_replay_without_failing_a_turn(
    cluster: ClusterApp, tmp_path: Path
) -> None:
    fixed, scaled = scaling.autoscale_runs(cluster, tmp_path, fixed=scaling.FIXED_REPLICAS)
    scaling.write_outputs(tmp_path / "autoscale", fixed, scaled)
    for run in (fixed, scaled):
        print(json.dumps(run.summary()), f"misses {len(timeline.cache_misses(run.turns))}")
    print(f"picture: {tmp_path / 'autoscale.svg'}")

    for run in (fixed, scaled):
        assert not run.errors, run.errors[:5]
        failed = scaling.failures(run.turns)
        assert not failed, [(turn["outcome"], turn["detail"]) for turn in failed[:10]]
        assert len(run.turns) > 100, f"{run.name}: only {len(run.turns)} turns"

    (_, first), (high_end, high), (low_end, low) = parse_shape(scaling.SHAPE)[:3]
    assert high > first and high > low
    since = [(s["at"] - scaled.start, s) for s in scaled.samples]
    high_stage = [s for at, s in since if at < high_end]
    low_stage = [s for at, s in since if high_end <= at < low_end]
    most = scaling.AUTOSCALING["max_replicas"]
    assert scaled.samples[0]["running"] == scaling.AUTOSCALING["min_replicas"], scaled.samples[0]
    # Scaled up under the high load: its replicas asked for then, and running before the load
    # ended (a replica takes 10-15 s to start here, more under a load average of 30).
    assert max(s["running"] + s["starting"] for s in high_stage) == most, "it did not scale up"
    assert max(s["running"] for at, s in since if at < low_end) == most
    # Scaled down while the lower load went on: a replica stopped, with conversations on it.
    assert any(s["stopping"] for s in low_stage), "no replica was stopped under the lower load"
    assert low_stage[-1]["running"] < most
    stopped = stopped_under_load(low_stage)
    assert stopped, "no replica that was stopped under load had conversations on it"
    print(f"stopped under the lower load (conversations, generating): {stopped}")
    assert scaling.at_minimum(scaled.samples[-1]), scaled.samples[-1]

    fixed_rate, scaled_rate = timeline.hit_rate(fixed.turns), timeline.hit_rate(scaled.turns)
    assert fixed_rate is not None and scaled_rate is not None
    assert scaled_rate >= fixed_rate - HIT_RATE_MARGIN, (scaled_rate, fixed_rate)
    assert min(scaled_rate, fixed_rate) >= HIT_RATE_FLOOR, (scaled_rate, fixed_rate)


def stopped_under_load(stage: list[dict]) -> dict[str, tuple[int, int]]:
    """The replicas Serve stopped during ``stage`` with conversations on them (served in the
    last 30 s, as they report them), each with the most conversations and the most requests
    generating it was seen with while stopping."""
    held: dict[str, tuple[int, int]] = {}
    for sample, name in stopping(stage):
        _, generating, conversations = sample["replicas"][name]
        before = held.get(name[-8:], (0, 0))
        held[name[-8:]] = (max(before[0], conversations or 0), max(before[1], generating or 0))
    return {name: seen for name, seen in held.items() if seen[0]}
