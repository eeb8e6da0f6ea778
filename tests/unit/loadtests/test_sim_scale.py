"""loadtests/sim_scale.py: its turns without harmony grow as the session does and share only the
base prompt, its routers receive reports as Ray Serve delivers them (every replica's, at most
once a control loop, when any changed) and loads only on open channels, and the memory it
counts is each object once."""

from __future__ import annotations

import sys
from collections import Counter

from serve_app.routing.directory import REPORT_KEY, REPORTED_AT_KEY
from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
from sim_scale import (
    CHANNEL_IDLE_S,
    CONTROL_LOOP_S,
    FromScratchPlacer,
    RayFed,
    SyntheticTurns,
    deep_size,
    item_tokens,
)
from traces import generate

BASE = list(range(100, 164))


def test_each_turn_extends_the_last_and_sessions_share_only_the_base() -> None:
    sessions = generate(3, 1.0, 5, 3, 5)
    turns = SyntheticTurns(sessions, BASE)
    for session in sessions:
        mine = turns[session.session_id]
        assert len(mine) == len(session.turns)
        for index in range(1, len(mine)):
            before, now = mine[index - 1].token_ids, mine[index].token_ids
            assert now[: len(before)] == before
            added = sum(item_tokens(item) for item in session.turns[index]["new_items"])
            assert len(now) - len(before) == added
        assert mine[0].token_ids[: len(BASE)] == BASE
        assert mine[0].routing_key == session.session_id
    first, second = (turns[s.session_id][0].token_ids for s in sessions[:2])
    assert first[len(BASE)] != second[len(BASE)]  # nothing shared past the base
    assert [t.index for t in turns[sessions[0].session_id]] == list(range(len(sessions[0].turns)))


def test_deep_size_counts_what_is_referenced_once() -> None:
    shared = list(range(1000))
    assert deep_size([shared, shared]) < deep_size([shared, list(range(1000))])
    assert deep_size({"a": shared}) > deep_size(shared)


def fed(replicas: int, routers: int) -> RayFed:
    members = [f"replica-{i}" for i in range(replicas)]
    return RayFed(members, routers, 1.0, 0.005, 0.02, seed=1, ttft_slack_s=0.05)


def test_reports_reach_every_router_at_most_once_a_control_loop_all_of_them_each_time() -> None:
    policy = fed(40, 3)
    policy._catch_up(10.0)
    for placer in policy.placers:
        # 40 replicas report once a second each, at their own phase: a change in nearly every
        # 0.1 s loop, so about ten deliveries a second, each of all 40 replicas' stats.
        assert 85 <= placer.broadcasts <= 1 + 10.0 / CONTROL_LOOP_S
        # (in the first second, only the replicas that have reported yet)
        assert 40 * (placer.broadcasts - 10) <= placer.reports_received <= 40 * placer.broadcasts
    few = fed(2, 1)
    few._catch_up(10.0)
    assert few.placers[0].broadcasts <= 2 * 10 + 2  # two replicas: about two a second


def test_a_replicas_load_reaches_only_the_routers_with_a_channel_open_to_it() -> None:
    policy = fed(2, 3)
    policy.channels[(0, "replica-0")] = 5.0  # router 0 sent replica-0 a request at 5 s
    policy.channels[(1, "replica-0")] = 1.0
    load = {REPORTED_AT_KEY: 5.5, "queued_prefill_tokens": 100, "decoding": 1}
    policy._deliver_at("replica-0", load, 5.5)
    assert [p.pushes_received for p in policy.placers] == [1, 0, 0]
    policy._deliver_at("replica-0", load, 5.0 + CHANNEL_IDLE_S + 0.1)
    assert [p.pushes_received for p in policy.placers] == [1, 0, 0]


def test_the_placer_as_it_was_and_as_it_is_see_the_same_homes() -> None:
    reports = {
        "r0": {REPORT_KEY: {1: 10.0, 2: 11.0}, REPORTED_AT_KEY: 12.0},
        "r1": {REPORT_KEY: {2: 13.0, 3: 9.0}, REPORTED_AT_KEY: 14.0},
    }
    old, new = FromScratchPlacer(clock=lambda: 20.0), fed(2, 1).placers[0]
    for placer in (old, new):
        placer.set_members(reports)
        placer.set_reports(reports)
    assert old.directory.homes == new.directory.homes
    assert Counter(old.directory.active) == Counter(new.directory.active)
