"""gpt-oss's `python` tool: the model's code in a fresh subprocess, with limits.

Stateless, as the `gpt-oss` package's docker backend is: every call is a new process in a new
empty temporary directory (its cwd and HOME, removed afterwards), with no environment of the
server's. The tool's output is what the process wrote, stdout and stderr interleaved as written,
as the docker backend returns it. Limits: CPU seconds and address space (RLIMIT_CPU, RLIMIT_AS),
size of written files, open files, processes (RLIMIT_NPROC), wall time (the whole process group
is killed), output bytes (the process is stopped once it has written more); a run dies with the
server (setpriv's parent-death signal).

Isolation: ``bwrap`` (the default, sandbox.py): each run in a bubblewrap sandbox showing only
its work directory and the interpreter, read-only but for the former, with no network, no
Unix socket of the host's and a process limit. Told to run unsandboxed (``--python-sandbox
none``, where bubblewrap cannot make one): ``netns``, new user, network and PID namespaces
(`unshare`: no network, its children die with it, but the host's files and Unix sockets in
reach), or, where even that cannot be made, ``hook``: an audit hook refusing sockets and new
processes (no boundary: see docs/tools.md). NOT a production sandbox in any mode.
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

from serve_app.toolserver import sandbox
from serve_app.toolserver.sandbox import SandboxUser, bwrap_works

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
SandboxChoice = Literal["bwrap", "none"]
Isolation = Literal["bwrap", "netns", "hook"]


@dataclass(frozen=True)
class PythonLimits:
    cpu_seconds: int = 10
    wall_seconds: float = 30.0
    memory_bytes: int = 1024 * 1024 * 1024
    output_bytes: int = 64 * 1024
    file_bytes: int = 16 * 1024 * 1024
    open_files: int = 64
    # Processes the run's user may have at once (RLIMIT_NPROC): a fork bomb stops there.
    processes: int = 32
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


class NoSandbox(RuntimeError):
    """The python tool cannot have its sandbox here, and was not told to run without one."""


def resolve_isolation(
    choice: SandboxChoice, network: NetworkIsolation, python: str = sys.executable
) -> Isolation:
    """``bwrap`` when asked for (the default) and this machine can make it (`NoSandbox`
    otherwise: no python tool at all rather than one without its sandbox); unsandboxed
    only when told (``none``), said loudly, isolated by ``network``'s means."""
    if choice == "bwrap":
        if bwrap_works(python):
            return "bwrap"
        raise NoSandbox(
            "the python tool's sandbox cannot be made here: bubblewrap (Debian: apt-get install "
            "bubblewrap) is missing or cannot create namespaces. Refusing to run model code "
            "without it; --python-sandbox none runs it unsandboxed (tests and laptops only)."
        )
    log.warning(
        "python tool UNSANDBOXED (--python-sandbox none): the code runs as this server's user "
        "and can read its files and connect to its Unix sockets (Ray's among them); "
        "never do this where untrusted text reaches the model (docs/tools.md)"
    )
    return _unsandboxed(network)


def _unsandboxed(requested: NetworkIsolation) -> Literal["netns", "hook"]:
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
        isolation: Isolation = "hook",
        python: str = sys.executable,
        child: Path = CHILD,
    ) -> None:
        self.limits = limits or PythonLimits()
        self.isolation = isolation
        self.python = python
        self.child = child
        self._slots = asyncio.Semaphore(self.limits.concurrency)
        # Each run in flight holds one slot number: a root server's run becomes its user.
        self._free = list(range(self.limits.concurrency))
        with_setpriv = sys.platform == "linux" and shutil.which("setpriv") is not None
        self._guard = list(PARENT_DEATH_PREFIX) if with_setpriv else []

    async def run(self, code: str) -> str:
        async with self._slots:
            slot = self._free.pop()
            try:
                with tempfile.TemporaryDirectory(
                    prefix="serve-app-python-", ignore_cleanup_errors=True
                ) as workdir:
                    return await self._run_in(code, Path(workdir), slot)
            finally:
                self._free.append(slot)

    def command(self, workdir: Path, user: SandboxUser | None = None) -> list[str]:
        """The run's command line: its isolation's, then the child with its limits."""
        child_limits = asdict(self.limits) | {"block_network": self.isolation == "hook"}
        if user is not None:
            child_limits |= {"uid": user.uid, "gid": user.gid}
        python = [self.python, "-I", "-u", str(self.child), json.dumps(child_limits), SCRIPT_NAME]
        if self.isolation == "bwrap":
            return [*self._guard, *sandbox.command(self.python, self.child, workdir, user), *python]
        isolated = [*NETNS_PREFIX, *python] if self.isolation == "netns" else python
        return [*self._guard, *isolated]

    def _user(self, slot: int) -> SandboxUser | None:
        """The user a sandboxed run becomes (a root server's: one per slot)."""
        if self.isolation != "bwrap":
            return None
        return sandbox.sandbox_user(slot, os.geteuid())

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

    async def _run_in(self, code: str, workdir: Path, slot: int) -> str:
        (workdir / SCRIPT_NAME).write_text(code, encoding="utf-8")
        user = self._user(slot)
        if user is not None:  # the run's own user writes there, and only there
            os.chown(workdir, user.uid, user.gid)
        process = await asyncio.create_subprocess_exec(
            *self.command(workdir, user),
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
        """The signal that ended the code: asyncio's -N, or 128 + N from the namespace's init
        (ours under unshare, bwrap's in its sandbox)."""
        if returncode is not None and returncode < 0:
            return -returncode
        namespaced = self.isolation in ("netns", "bwrap")
        if namespaced and returncode is not None and 128 < returncode < 160:
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
