"""A replay's figures over time (loadtests/timeline.py) and the load shape of the locust replay
(loadtests/load_shape.py): windows, hit rates, cache misses, the CSV and the picture."""

from __future__ import annotations

import csv
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
import timeline
from load_shape import changes, end_of, parse_shape, users_at


def turn(session: str, number: int, start: float, end: float, **figures: object) -> dict:
    return {
        "outcome": "acked",
        "session": session,
        "turn": number,
        "started_at": start,
        "at": end,
        "ttft_ms": 100.0,
        "input_tokens": 1000,
        "cached_tokens": 900,
        **figures,
    }


def test_the_load_shape_is_users_by_stage() -> None:
    stages = parse_shape("5:3,40:12,65:5")
    assert stages == [(5.0, 3), (40.0, 12), (65.0, 5)]
    assert [users_at(stages, t) for t in (0, 4.9, 5, 39, 40, 64.9, 65)] == [
        3,
        3,
        12,
        12,
        5,
        5,
        None,
    ]
    assert changes(stages) == [(0.0, 3), (5.0, 12), (40.0, 5), (65.0, 0)]
    assert end_of(stages) == 65.0
    with pytest.raises(ValueError):
        parse_shape("40:12,5:3")


def test_the_hit_rate_is_token_weighted_over_acknowledged_turns() -> None:
    turns = [
        turn("a", 0, 0, 1, input_tokens=1000, cached_tokens=0),
        turn("a", 1, 1, 2, input_tokens=3000, cached_tokens=3000),
        {**turn("b", 0, 0, 1), "outcome": "refused"},
    ]
    assert timeline.hit_rate(turns) == 0.75
    assert timeline.hit_rate([]) is None


def test_a_miss_is_a_turn_that_did_not_find_the_turn_before_it_cached() -> None:
    turns = [
        turn("a", 0, 0, 1, input_tokens=5000, cached_tokens=4800),
        turn("a", 1, 2, 3, input_tokens=6000, cached_tokens=5000),  # home: all of turn 0
        turn("a", 2, 4, 5, input_tokens=7000, cached_tokens=4800),  # moved: Codex's prefix only
        turn("b", 0, 0, 1, input_tokens=5000, cached_tokens=0),  # a first turn is never one
    ]
    assert [(t["session"], t["turn"]) for t in timeline.cache_misses(turns)] == [("a", 2)]


def test_rows_count_turns_and_replicas_per_window(tmp_path: Path) -> None:
    turns = [
        turn("a", 0, 0.5, 2.0, ttft_ms=100.0),
        turn("b", 0, 1.0, 6.0, ttft_ms=300.0, cached_tokens=500),
        {**turn("c", 0, 6.0, 7.0), "outcome": "refused", "ttft_ms": None},
    ]
    samples = [
        {"at": 1.0, "running": 1, "starting": 1, "stopping": 0},
        {"at": 6.0, "running": 2, "starting": 0, "stopping": 1},
    ]
    rows = timeline.rows(turns, samples, start=0.0, end=10.0, window_s=5.0)
    assert [(r.t, r.running, r.starting, r.stopping) for r in rows] == [
        (5.0, 1, 1, 0),
        (10.0, 2, 0, 1),
    ]
    assert [(r.in_flight, r.turns, r.failed) for r in rows] == [(1, 1, 0), (0, 2, 1)]
    assert rows[0].ttft_p90_ms == 300.0 and rows[0].hit_rate == 0.7
    assert rows[1].ttft_p90_ms is None and rows[1].hit_rate is None  # only a failed turn began

    timeline.write_csv(rows, tmp_path / "run.csv")
    with (tmp_path / "run.csv").open() as handle:
        written = list(csv.DictReader(handle))
    assert written[0]["running"] == "1" and written[1]["failed"] == "1"


def test_the_picture_is_an_svg_with_a_panel_per_figure_and_the_reference_dashed() -> None:
    rows = [
        timeline.Row(5.0, 1, 0, 0, 3, 10, 0, 120.0, 0.9),
        timeline.Row(10.0, 3, 0, 0, 12, 40, 0, None, 0.95),
        timeline.Row(15.0, 2, 0, 1, 5, 20, 0, 90.0, 0.93),
    ]
    picture = timeline.picture(
        rows, "a run & its title", marks=[(5.0, "12 users")], reference=rows[:2]
    )
    root = ElementTree.fromstring(picture)  # well-formed XML (the title's & escaped)
    texts = [element.text for element in root.iter("{http://www.w3.org/2000/svg}text")]
    for title in ("load", "engine replicas", "TTFT p90", "a run & its title", "12 users"):
        assert title in texts
    lines = list(root.iter("{http://www.w3.org/2000/svg}polyline"))
    assert any(line.get("stroke-dasharray") for line in lines)  # the reference
    # A missing value breaks the TTFT line: two pieces, not a line through zero.
    purple = [line for line in lines if line.get("stroke") == "#9467bd"]
    assert len(purple) == 2
