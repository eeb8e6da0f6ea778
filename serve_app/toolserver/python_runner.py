"""gpt-oss's `python` tool: the model's code in a fresh subprocess, with limits.

Stateless, as the `gpt-oss` package's docker backend is: every call is a new process in a new
empty temporary directory (its cwd and HOME, removed afterwards), with no environment of the
server's. The tool's output is what the process wrote, stdout and stderr interleaved as written,
as the docker backend returns it. Limits: CPU seconds and address space (RLIMIT_CPU, RLIMIT_AS),
size of written files, open files, wall time (the whole process group is killed), output bytes
(the process is stopped once it has written more); a run dies with the server (setpriv's
parent-death signal). No network: on Linux the process runs in new user, network and PID
namespaces (`unshare`), so it sees only a loopback that is down and its children die with it;
where that cannot be made, an audit hook refuses sockets and new processes instead (weaker: see
docs/tools.md). NOT a production sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("sandbox_child.py")
SCRIPT_NAME = "script.py"
NO_OUTPUT = (
    "[WARN] No output available. Use print() to output anything to stdout to receive the output"
)
NETNS_PREFIX = ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child")
# The run dies with the server, even a server killed outright (SIGKILL) that could not stop it:
# the parent-death signal survives exec into unshare (whose --kill-child passes it on) or python.
PARENT_DEATH_PREFIX = ("setpriv", "--pdeathsig", "KILL")
NetworkIsolation = Literal["auto", "netns", "hook"]


@dataclass(frozen=True)
class PythonLimits:
    cpu_seconds: int = 10
    wall_seconds: float = 30.0
    memory_bytes: int = 1024 * 1024 * 1024
    output_bytes: int = 64 * 1024
    file_bytes: int = 16 * 1024 * 1024
    open_files: int = 64
    concurrency: int = 4


def netns_works() -> bool:
    """Whether this machine lets an unprivileged process make the namespaces (checked once)."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run([*NETNS_PREFIX, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def resolve_isolation(requested: NetworkIsolation) -> Literal["netns", "hook"]:
    if requested == "hook":
        return "hook"
    if netns_works():
        return "netns"
    if requested == "netns":
        raise RuntimeError("--python-network netns: unshare cannot make a network namespace here")
    log.warning(
        "python tool: no network namespace on this machine (unshare failed); "
        "falling back to an audit hook that refuses sockets, which is no security boundary"
    )
    return "hook"


@dataclass
class _Run:
    output: bytearray
    truncated: bool = False
    timed_out: bool = False


class PythonRunner:
    """Runs code under `limits`, at most `limits.concurrency` at once (the rest wait)."""

    def __init__(
        self,
        limits: PythonLimits | None = None,
        isolation: Literal["netns", "hook"] = "hook",
        python: str = sys.executable,
    ) -> None:
        self.limits = limits or PythonLimits()
        self.isolation = isolation
        self.python = python
        self._slots = asyncio.Semaphore(self.limits.concurrency)
        with_setpriv = sys.platform == "linux" and shutil.which("setpriv") is not None
        self._guard = list(PARENT_DEATH_PREFIX) if with_setpriv else []

    async def run(self, code: str) -> str:
        async with self._slots:
            with tempfile.TemporaryDirectory(
                prefix="serve-app-python-", ignore_cleanup_errors=True
            ) as workdir:
                return await self._run_in(code, Path(workdir))

    def command(self) -> list[str]:
        child_limits = asdict(self.limits) | {"block_network": self.isolation == "hook"}
        python = [self.python, "-I", "-u", str(CHILD), json.dumps(child_limits), SCRIPT_NAME]
        isolated = [*NETNS_PREFIX, *python] if self.isolation == "netns" else python
        return [*self._guard, *isolated]

    def environment(self, workdir: Path) -> dict[str, str]:
        threads = "1"  # numerical libraries' thread pools would each map memory (RLIMIT_AS)
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "OPENBLAS_NUM_THREADS": threads,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
        }

    async def _run_in(self, code: str, workdir: Path) -> str:
        (workdir / SCRIPT_NAME).write_text(code, encoding="utf-8")
        process = await asyncio.create_subprocess_exec(
            *self.command(),
            cwd=workdir,
            env=self.environment(workdir),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed as one
        )
        run = _Run(output=bytearray())
        try:
            await asyncio.wait_for(self._read(process, run), timeout=self.limits.wall_seconds)
        except TimeoutError:
            run.timed_out = True
        finally:
            _kill_group(process)
            with contextlib.suppress(ProcessLookupError):
                await process.wait()
        return self._report(run, process.returncode)

    async def _read(self, process: asyncio.subprocess.Process, run: _Run) -> None:
        if process.stdout is None:  # asked for above (PIPE): never
            return
        while chunk := await process.stdout.read(65536):
            room = self.limits.output_bytes - len(run.output)
            run.output += chunk[:room]
            if len(chunk) > room:
                run.truncated = True
                return  # stopped by the caller's kill: no point running what nobody reads
        await process.wait()

    def _report(self, run: _Run, returncode: int | None) -> str:
        text = run.output.decode("utf-8", errors="replace")
        notes = []
        if run.truncated:
            notes.append(
                f"[WARN] Output truncated at {self.limits.output_bytes} bytes; "
                "the process was stopped."
            )
        if run.timed_out:
            notes.append(
                f"[ERROR] Execution timed out after {self.limits.wall_seconds:g} seconds "
                "and was stopped."
            )
        elif not run.truncated and (number := self._killed_by(returncode)) is not None:
            notes.append(self._signal_note(number))
        if notes:
            text = (text.rstrip("\n") + "\n" if text.strip() else "") + "\n".join(notes)
        return text if text.strip() else NO_OUTPUT

    def _killed_by(self, returncode: int | None) -> int | None:
        """The signal that ended the code: asyncio's -N, or 128 + N from the namespace's init."""
        if returncode is not None and returncode < 0:
            return -returncode
        if self.isolation == "netns" and returncode is not None and 128 < returncode < 160:
            return returncode - 128
        return None

    def _signal_note(self, number: int) -> str:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        if number == signal.SIGXCPU:
            why = f" (the CPU time limit is {self.limits.cpu_seconds} seconds)"
        elif number == signal.SIGKILL:
            why = f" (at the CPU time limit of {self.limits.cpu_seconds} seconds, or out of memory)"
        else:
            why = ""
        return f"[ERROR] The process was killed by {name}{why}."


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """Kill the run's process group: whatever the code started and left running too."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
