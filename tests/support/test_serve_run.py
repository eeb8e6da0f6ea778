"""The ``serve run`` harness's stop (tests/support/serve_run.py): nothing the run started outlives
it, also a process in a group of its own, as Serve's HAProxy is. A stand-in session leader here,
not Ray: the harness sees only processes and sessions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.serve_run import ServeRun, stop

# A session leader that starts a child in a process group of its own (as Ray starts Serve's
# HAProxy), says its pid, and waits for Ctrl-C.
LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], process_group=0)
print(child.pid, flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the harness reads /proc (Linux)")
def test_stop_ends_a_process_the_run_left_in_a_group_of_its_own(tmp_path: Path) -> None:
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER], stdout=subprocess.PIPE, start_new_session=True
    )
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    assert os.getpgid(child) == child  # Ctrl-C to the leader's group does not reach it
    try:
        stop(ServeRun(leader, "http://unused", tmp_path / "serve.log"), timeout_s=10)
        assert leader.returncode is not None
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "a process the run started outlived its stop"
    finally:
        if alive(child):
            os.kill(child, 9)
