"""The cluster replay's traces and marks (loadtests/scaling.py); the replay itself runs in the
cluster stage (tests/cluster/)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
import scaling
from traces import load_traces


def test_tagged_traces_share_codex_instructions_and_nothing_of_their_own(tmp_path: Path) -> None:
    one = load_traces(scaling.write_traces(tmp_path / "one.jsonl", "one", sessions=5))
    two = load_traces(scaling.write_traces(tmp_path / "two.jsonl", "two", sessions=5))
    for first, second in zip(one, two, strict=True):
        assert first.session_id.startswith("one-") and second.session_id.startswith("two-")
        assert first.session_id[4:] == second.session_id[4:]
        a, b = first.turn_input(len(first.turns) - 1), second.turn_input(len(second.turns) - 1)
        assert a[0] == b[0]  # Codex's instructions: shared, as every Codex user's are
        assert a[1] != b[1] and "/one/" in a[1]["content"][0]["text"]  # the environment line
        assert a[2:] == b[2:]  # the same session otherwise: the same tokens to replay


def test_marks_name_the_users_from_each_change_on() -> None:
    assert scaling.shape_marks("5:3,40:12,65:5") == [
        (5.0, "12 users"),
        (40.0, "5 users"),
        (65.0, "0 users"),
    ]
    assert scaling.shape_end("5:3,40:12,65:5") == 65.0
