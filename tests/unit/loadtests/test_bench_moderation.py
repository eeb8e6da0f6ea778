"""loadtests/bench_moderation.py: a tiny run of the whole benchmark (the app over HTTP, the
simulated classifier, every mode) prints every figure it promises."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.helpers import REPO

ROW = re.compile(
    r"^(none|score|block input|block both) +-?\d+ms +-?\d+ms +-?\d+ms +-?\d+ms +(\d+ms|-)$"
)


def test_a_tiny_run_prints_each_mode() -> None:
    script = REPO / "loadtests" / "bench_moderation.py"
    command = [sys.executable, str(script), "--requests", "1", "--prompt-words", "50"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    rows = [line for line in run.stdout.splitlines() if ROW.match(line)]
    assert [row.split("  ")[0].strip() for row in rows] == [
        "none",
        "score",
        "block input",
        "block both",
    ], run.stdout
    assert rows[0].endswith("-") and all(row.endswith("ms") for row in rows[1:])
