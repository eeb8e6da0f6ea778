"""The Codex-like traces and their locust replay."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from tests.helpers import REPO

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
            render_request(ResponsesRequest.model_validate(body))  # pairs checked, renders


def test_a_short_locust_replay_completes_with_cache_hits(app_url: str, tmp_path: Path) -> None:
    prefix = tmp_path / "run"
    locust = Path(sys.executable).parent / "locust"
    result = subprocess.run(
        [
            str(locust),
            "-f",
            str(REPO / "loadtests" / "locustfile.py"),
            "--headless",
            "-u",
            "2",
            "-r",
            "2",
            "-t",
            "15s",
            "--host",
            app_url,
            "--csv",
            str(prefix),
            "--only-summary",
        ],
        env={**os.environ, "TRACE_TIME_SCALE": "0.01"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert prefix.with_name("run_stats.csv").exists(), result.stderr[-3000:]
    table = report(str(prefix)).splitlines()[-1]
    requests, failures, _, _, share = [cell.strip() for cell in table.strip("|").split("|")]
    assert int(requests) >= 4 and int(failures) == 0, result.stderr[-3000:]
    assert float(share) > 0.5  # later turns re-send earlier ones: mostly from cache
