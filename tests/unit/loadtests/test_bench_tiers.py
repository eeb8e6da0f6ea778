"""loadtests/bench_tiers.py: a tiny run of each scenario plays what it means (the interactive
turns at priority, the flood at flex, every request at one tier without tiers) and the report
prints every number it promises."""

from __future__ import annotations

import re
import sys

from serve_app.protocol.service_tiers import PRIORITY
from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
import bench_tiers
from traces import generate


def test_the_requests_are_the_ingress_s_at_each_tier() -> None:
    engine, tiers = bench_tiers.local_settings()
    assert engine.prefill_chunk_tokens and engine.max_num_seqs  # configs/local.yaml's
    assert engine.default_output_tokens == 256  # the answers as long as the requests allow
    (session,) = generate(1, 1.0, seed=1, min_turns=2, max_turns=2)
    (turns,) = bench_tiers.interactive_turns([session], "priority", tiers)
    assert [turn.request.priority for turn in turns] == [PRIORITY["priority"]] * 2
    assert (
        turns[1].request.prompt_token_ids[: len(turns[0].request.prompt_token_ids) - 1]
        == (turns[0].request.prompt_token_ids[:-1])
    )
    flood = bench_tiers.flood_requests(3, "flex", tiers, seed=1)
    assert {request.deadline_s for request in flood} == {tiers.deadline_s["flex"]}
    assert len({request.session_id for request in flood}) == 3
    # One shared instruction: the second request's prompt starts as the first's does.
    shared = [a == b for a, b in zip(*(r.prompt_token_ids for r in flood[:2]), strict=False)]
    assert shared.index(False) > 900


async def test_a_tiny_run_of_each_scenario_is_reported() -> None:
    engine, tiers = bench_tiers.local_settings()
    sessions = generate(2, 4.0, seed=2, min_turns=2, max_turns=2)
    runs = {
        scenario: await bench_tiers.play(scenario, sessions, 6, 0.2, 2, 1, engine, tiers)
        for scenario in bench_tiers.SCENARIOS
    }
    for name, run in runs.items():
        assert len(run.interactive) == 4, name
        assert all(served.finish in ("stop", "length") for served in run.interactive.values())
        if name != "alone":
            assert len(run.flood) == 6, name
            assert all(served.finish in ("stop", "length") for served in run.flood), name
    text = bench_tiers.report(runs, tiers)
    for scenario in bench_tiers.SCENARIOS:
        assert re.search(rf"^\| {scenario} \| \d+ \| \d+ / \d+ / \d+ \|", text, re.M), text
    assert re.search(r"^\| flood \|.*\| 6 / 6 \| [0-9.]+ / [0-9.]+ \| 60 \|$", text, re.M), text
    assert re.search(r"^TTFT p90 with the flex flood / alone: [0-9.]+x", text, re.M), text
