"""gpt-oss's python tool, through the `mcp` SDK's client against the running reference tool
server: what the code prints, and each limit (wall time, CPU time, memory, output, network),
alone and with eight runs at once. The server's limits: tests/unit/toolserver/conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from serve_app.toolserver.python_runner import NO_OUTPUT, PythonLimits, PythonRunner, netns_works
from serve_app.toolserver.sandbox import bwrap_works
from tests.support.toolserver import ToolServer, mcp_session, text_of, tool_server

WALL_SECONDS = 10  # the server's (conftest.py): room for 1 CPU second on a loaded machine
OUTPUT_BYTES = 4096
SLEEP_FOREVER = "import time\nprint('sleeping', flush=True)\ntime.sleep(600)"
SPIN = "while True:\n    pass"
MEMORY_BOMB = (
    "chunks = []\n"
    "try:\n"
    "    while True:\n"
    "        chunks.append(bytearray(16 * 2**20))\n"
    "except MemoryError:\n"
    "    print('got MiB:', 16 * len(chunks))\n"
    "    raise\n"
)
MEMORY_MB = 256
FLOOD = "while True:\n    print('x' * 100)"


def connect_to(port: int) -> str:
    """Code that connects to the tool server's own loopback port, which the host can reach."""
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "    print('CONNECTED')\n"
        "except OSError as error:\n"
        "    print('refused:', type(error).__name__, error)\n"
    )


async def run(server: ToolServer, code: str) -> tuple[str, float]:
    async with mcp_session(server.mcp_url) as session:
        started = time.monotonic()
        result = await session.call_tool("python", {"code": code})
        elapsed = time.monotonic() - started
    assert not result.is_error
    return text_of(result), elapsed


def port_of(server: ToolServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


async def test_stdout_and_stderr_as_written(server: ToolServer) -> None:
    code = "import sys\nprint('out 1')\nprint('err', file=sys.stderr)\nprint(6 * 7)"
    output, _ = await run(server, code)
    assert output == "out 1\nerr\n42\n"


async def test_an_exception_is_its_traceback_and_silence_is_a_warning(server: ToolServer) -> None:
    failed, _ = await run(server, "x = 1\n1 / x0")
    silent, _ = await run(server, "x = 1")
    assert failed.startswith('Traceback (most recent call last):\n  File "script.py", line 2')
    assert failed.rstrip().endswith("NameError: name 'x0' is not defined")
    assert silent == NO_OUTPUT


async def test_each_run_is_a_fresh_process_in_an_empty_directory(server: ToolServer) -> None:
    first, _ = await run(server, "import os\nopen('kept.txt', 'w').write('x')\nprint(os.getcwd())")
    second, _ = await run(server, "import os\nprint(os.getcwd(), os.listdir('.'))")
    assert first.strip() != second.split()[0]  # another directory
    assert "kept.txt" not in second and "script.py" in second
    assert not Path(first.strip()).exists()  # removed after the run
    secrets, _ = await run(server, "import os\nprint(sorted(os.environ))")
    assert "PYTHONPATH" not in secrets  # the server's environment stays with the server


async def test_wall_time_is_enforced(server: ToolServer) -> None:
    output, elapsed = await run(server, SLEEP_FOREVER)
    assert output.startswith("sleeping\n")
    assert f"[ERROR] Execution timed out after {WALL_SECONDS} seconds" in output
    assert WALL_SECONDS - 0.5 < elapsed < WALL_SECONDS + 5


async def test_cpu_time_is_enforced(server: ToolServer) -> None:
    output, elapsed = await run(server, SPIN)
    assert "[ERROR] The process was killed by SIGXCPU (the CPU time limit is 1 seconds)." in output
    assert elapsed < WALL_SECONDS


async def test_a_memory_bomb_is_stopped(server: ToolServer) -> None:
    output, elapsed = await run(server, MEMORY_BOMB)
    got = int(output.split("got MiB: ", 1)[1].split()[0])
    assert 64 < got < MEMORY_MB  # the interpreter's own mappings count against the bound too
    assert output.rstrip().endswith("MemoryError")
    assert elapsed < WALL_SECONDS


async def test_output_is_bounded_and_the_flood_stopped(server: ToolServer) -> None:
    output, elapsed = await run(server, FLOOD)
    printed, note = output.rsplit("\n", 1)
    assert len(printed.encode()) <= OUTPUT_BYTES
    assert note == f"[WARN] Output truncated at {OUTPUT_BYTES} bytes; the process was stopped."
    assert elapsed < WALL_SECONDS  # stopped at the bound, not at the wall time


async def test_no_network_even_to_the_hosts_loopback(server: ToolServer) -> None:
    output, _ = await run(server, connect_to(port_of(server)))
    assert "CONNECTED" not in output
    assert output.startswith("refused:")


async def test_no_network_through_the_audit_hook_fallback(hook_server: ToolServer) -> None:
    output, _ = await run(hook_server, connect_to(port_of(hook_server)))
    assert output.startswith("refused: PermissionError network access is disabled")
    spawned, _ = await run(hook_server, "import subprocess\nsubprocess.run(['true'])")
    assert "PermissionError: starting processes is disabled in this sandbox" in spawned


@pytest.mark.skipif(not netns_works(), reason="no user/network/PID namespaces on this machine")
async def test_what_the_code_starts_dies_with_it(server: ToolServer) -> None:
    marker = f"{os.getpid()}{int(time.time())}"
    code = (
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "print('started')"
    )
    try:
        output, _ = await run(server, code)
        await asyncio.sleep(0.5)
    finally:
        left = [pid for pid, command in _command_lines() if marker in command]
        for pid in left:  # a failure leaves nothing running behind it
            os.kill(pid, signal.SIGKILL)
    assert output == "started\n"  # not held open until the wall time by the child's pipe
    assert left == []


async def test_the_limits_hold_with_eight_runs_at_once(server: ToolServer) -> None:
    codes = {
        "sleep": SLEEP_FOREVER,
        "spin": SPIN,
        "bomb": MEMORY_BOMB,
        "flood": FLOOD,
        "net": connect_to(port_of(server)),
        "print": "print(sum(range(10)))",
        "spin2": SPIN,
        "sleep2": SLEEP_FOREVER,
    }
    started = time.monotonic()
    results = await asyncio.gather(*(run(server, code) for code in codes.values()))
    outputs = dict(zip(codes, (output for output, _ in results), strict=True))
    assert time.monotonic() - started < 2 * WALL_SECONDS - 1  # at once: two sleeps alone take 20 s
    for name in ("sleep", "sleep2"):
        assert "[ERROR] Execution timed out" in outputs[name]
    for name in ("spin", "spin2"):
        assert "SIGXCPU" in outputs[name]
    assert outputs["bomb"].rstrip().endswith("MemoryError")
    assert outputs["flood"].endswith("the process was stopped.")
    assert len(outputs["flood"].encode()) < OUTPUT_BYTES + 100
    assert outputs["net"].startswith("refused:")
    assert outputs["print"] == "45\n"


async def test_runs_beyond_the_concurrency_bound_wait_for_a_slot() -> None:
    runner = PythonRunner(PythonLimits(concurrency=2, wall_seconds=20), isolation="hook")
    started = time.monotonic()
    outputs = await asyncio.gather(*(runner.run("import time\ntime.sleep(1)") for _ in range(4)))
    assert outputs == [NO_OUTPUT] * 4
    assert time.monotonic() - started >= 2.0  # two rounds of two


def _command_lines() -> list[tuple[int, str]]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            lines.append((int(entry.name), command))
    return lines


async def test_a_cancelled_call_stops_its_run(hook_server: ToolServer, tmp_path: Path) -> None:
    """The client gives up (a response cancelled, a client gone): the code's process ends."""
    pid_file = tmp_path / "pid"
    code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)"

    async def call() -> None:
        async with mcp_session(hook_server.mcp_url) as session:
            await session.call_tool("python", {"code": code})

    task = asyncio.create_task(call())
    while not pid_file.exists() or not pid_file.read_text():
        await asyncio.sleep(0.05)
    pid = int(pid_file.read_text())
    assert _alive(pid)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.parametrize("isolation", ["bwrap", "netns", "hook"])
async def test_a_run_dies_with_a_killed_server(isolation: str, tmp_path: Path) -> None:
    """The server killed outright (no chance to stop its runs): its runs die with it. The run
    sleeps in a process named by a marker (in a PID namespace its pid is not the host's), or
    under the audit hook, which refuses exec, writes its pid to a file the test reads."""
    if isolation == "netns" and not netns_works():
        pytest.skip("no user/network/PID namespaces on this machine")
    if isolation == "bwrap" and not bwrap_works(sys.executable):
        pytest.skip("bubblewrap cannot make a sandbox on this machine")
    marker = f"doomed-{os.getpid()}-{isolation}-{time.monotonic_ns()}"
    pid_file = tmp_path / "pid"
    code = (
        "import os, sys\n"
        f"os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', "
        f"{marker!r}])"
    )
    if isolation == "hook":
        code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        code += "time.sleep(600)"
    flags = ["--python-sandbox", "bwrap"] if isolation == "bwrap" else []
    flags += [] if flags else ["--python-sandbox", "none", "--python-network", isolation]
    with tool_server(None, *flags) as doomed:

        async def call() -> None:
            async with mcp_session(doomed.mcp_url) as session:
                await session.call_tool("python", {"code": code})

        task = asyncio.create_task(call())
        found = pid_file if isolation == "hook" else None
        deadline = time.monotonic() + 30
        while not _marked(marker, found) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert _marked(marker, found), "the run never started"
        workdirs = _cwds(_marked(marker, found))
        doomed.process.kill()
        doomed.process.wait()
        with contextlib.suppress(Exception):
            await task
    deadline = time.monotonic() + 5
    while _marked(marker, found) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    left = _marked(marker, found)
    for pid in left:  # a failure leaves nothing running behind it
        os.kill(pid, signal.SIGKILL)
    # A server killed outright cannot remove its run's temporary directory: the test does.
    for workdir in workdirs:
        shutil.rmtree(workdir, ignore_errors=True)
    assert left == []


def _marked(marker: str, pid_file: Path | None = None) -> list[int]:
    """The running processes with ``marker`` in their command line, or the one whose pid
    ``pid_file`` holds."""
    if pid_file is not None:
        text = pid_file.read_text() if pid_file.exists() else ""
        return [int(text)] if text and _alive(int(text)) else []
    return [pid for pid, command in _command_lines() if marker in command and "-c" in command]


def _cwds(pids: list[int]) -> list[str]:
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            found.append(os.readlink(f"/proc/{pid}/cwd"))
    return found
