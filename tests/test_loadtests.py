"""The Codex-like traces and their locust replay."""

from __future__ import annotations

import sys
from pathlib import Path

from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving import validation
from tests.helpers import REPO, run_locust

sys.path.insert(0, str(REPO / "loadtests"))
from report import report
from traces import SAMPLE, generate, load_traces


def test_generation_is_deterministic_for_a_seed() -> None:
    first = [session.to_json() for session in generate(5, 2.0, seed=3)]
    assert first == [session.to_json() for session in generate(5, 2.0, seed=3)]
    assert first != [session.to_json() for session in generate(5, 2.0, seed=4)]


def test_every_turn_extends_the_previous_one_and_is_a_valid_request() -> None:
    sessions = load_traces(SAMPLE)
    assert len(sessions) >= 5
    for session in sessions:
        previous: list = []
        for index in range(len(session.turns)):
            items = session.turn_input(index)
            assert items[: len(previous)] == previous  # a prefix extension: cacheable
            previous = items
            body = {"model": "gpt-oss-120b", "input": items, "tools": session.tools}
            request = ResponsesRequest.model_validate(body)
            validation.check_items(request)  # pairs checked
            render_request(request)  # renders


def test_a_short_locust_replay_completes_with_cache_hits(app_url: str, tmp_path: Path) -> None:
    prefix = tmp_path / "run"
    result = run_locust(app_url, prefix, users=2, seconds=15, TRACE_TIME_SCALE="0.01")
    assert prefix.with_name("run_stats.csv").exists(), result.stderr[-3000:]
    table = report(str(prefix)).splitlines()[-1]
    requests, failures, _, _, share = [cell.strip() for cell in table.strip("|").split("|")]
    assert int(requests) >= 4 and int(failures) == 0, result.stderr[-3000:]
    assert float(share) > 0.5  # later turns re-send earlier ones: mostly from cache
