"""Pushed prefill load in the replay (loadtests/sim_push.py, `sim_routing.py --push-latency-s`):
a change of a replica's ledger goes out at once unless a push went out within the window,
else at the window's end with the load as of then; it reaches every router's predictor the
latency later, so a router sees the turns the other routers sent before the next report."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.routing.directory import REPORTED_AT_KEY
from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
from bench_routing import render_turns
from sim_push import Load, LoadPushes
from sim_routing import Ours, Replay
from traces import generate

LATENCY, WINDOW = 0.005, 0.02


class Recorded:
    """A `LoadPushes` whose loads say when they were taken, and what reached the routers."""

    def __init__(self) -> None:
        self.delivered: list[tuple[float, float]] = []  # (taken at, delivered at)
        self.pushes = LoadPushes(LATENCY, WINDOW, self.load_at, self.deliver_at)

    def load_at(self, _replica: str, at: float) -> Load:
        return {REPORTED_AT_KEY: at}

    def deliver_at(self, _replica: str, load: Load, at: float) -> None:
        self.delivered.append((load[REPORTED_AT_KEY], at))

    def change(self, now: float) -> None:
        self.pushes.advance(now)  # as the replay does before each event
        self.pushes.changed("replica-0", now)


def test_a_change_goes_out_at_once_or_at_the_end_of_the_window() -> None:
    recorded = Recorded()
    recorded.change(0.0)  # no push before: at once
    recorded.change(0.01)  # within the window: at its end, 0.02
    recorded.change(0.015)  # the same push carries it
    recorded.change(0.03)  # the push at 0.02 went out before this change: at 0.04
    recorded.change(0.1)  # quiet since 0.04: at once
    recorded.pushes.advance(1.0)
    taken = [0.0, 0.02, 0.04, 0.1]
    assert recorded.delivered == [pytest.approx((at, at + LATENCY)) for at in taken], (
        recorded.delivered
    )
    assert recorded.pushes.sent == len(taken)


def test_a_push_reaches_the_routers_only_after_its_latency() -> None:
    recorded = Recorded()
    recorded.change(0.0)
    recorded.pushes.advance(LATENCY / 2)
    assert recorded.delivered == []
    recorded.pushes.advance(LATENCY)
    assert recorded.delivered == [(0.0, LATENCY)]


def test_the_other_router_sees_a_turn_once_its_replica_pushed_it() -> None:
    ours = Ours(
        ["replica-0", "replica-1"],
        ingress_replicas=2,
        push_latency_s=LATENCY,
        push_window_s=WINDOW,
        ttft_slack_s=0.05,
    )
    ours("warm-up", {"replica-0": 0, "replica-1": 0}, 0.0, 10)  # the first round of reports
    other = ours.placers[1].predictor

    def queue_gap() -> float:
        """How much longer a turn would wait on replica-0 than on replica-1, by ``other``."""
        return other.predict("replica-0", "x", 100) - other.predict("replica-1", "x", 100)

    # A 5,000-token turn reaches replica-0 at 0.1 s (sent by the first router, say).
    ours.clock.now = 0.1
    ours.reporters["replica-0"].arrived("0/0", "k", 5000)
    ours.pushes.changed("replica-0", 0.1)
    ours.pushes.advance(0.1 + LATENCY / 2)
    assert queue_gap() == pytest.approx(0.0, abs=1e-6)  # not there yet: the report has nothing
    ours.pushes.advance(0.1 + LATENCY)
    assert queue_gap() > 0.1  # thousands of tokens queued, as the replica holds them now


Pushed = tuple[str, float, float]  # (replica, taken at, delivered at)


def small_replay(push_latency_s: float | None) -> tuple[list[float], list[Pushed]]:
    """By TTFT behind two routers, where prefills queue: each turn's TTFT, and every push
    that reached the routers."""
    sessions = generate(30, 5.0, seed=7)
    rendered = {session.session_id: render_turns(session) for session in sessions}
    engine = SimulatedEngineConfig(prefill_tokens_per_s=5000)
    members = [f"replica-{index}" for index in range(4)]
    ours = Ours(
        members,
        ingress_replicas=2,
        push_latency_s=push_latency_s,
        push_window_s=WINDOW,
        ttft_slack_s=0.05,
    )
    delivered: list[Pushed] = []
    if ours.pushes is not None:
        deliver = ours._deliver_at

        def recording(replica: str, load: Load, at: float) -> None:
            delivered.append((replica, load[REPORTED_AT_KEY], at))
            deliver(replica, load, at)

        ours.pushes._deliver_at = recording
    result = Replay(sessions, rendered, ours, members, engine, 64).run()
    return result.ttfts_ms, delivered


def test_in_the_replay_pushes_follow_the_rule_and_change_the_placement() -> None:
    without, _ = small_replay(None)
    never, late = small_replay(1e6)  # pushed, but none arrives before the replay ends
    assert never == without and late == []  # the pushes alone change nothing
    with_pushes, delivered = small_replay(LATENCY)
    assert len(delivered) > 100
    assert all(at == pytest.approx(taken + LATENCY) for _, taken, at in delivered)
    for member in {replica for replica, _, _ in delivered}:
        taken = [at for replica, at, _ in delivered if replica == member]
        assert min(b - a for a, b in itertools.pairwise(taken)) >= WINDOW - 1e-9  # 1 a window
    assert with_pushes != without  # the routers place by what the pushes told them


def test_the_replay_command_runs_with_pushes() -> None:
    command = [sys.executable, str(REPO / "loadtests" / "sim_routing.py"), "--seeds", "7"]
    command += ["--sessions", "6", "--replicas", "2", "--ingress-replicas", "2"]
    command += ["--ttft-slack-s", "0.05", "--clairvoyant-slack-s", "0.05"]
    command += ["--push-latency-s", "0.005", "--push-window-s", "0.01"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout
    assert "| ours, by TTFT (slack 0.05 s) |" in out
    assert "loads pushed 0.005 s late, 0.01 s apart" in out
