"""The python tool's sandbox: each run in a bubblewrap (`bwrap`, Debian's `bubblewrap`) sandbox
of its own.

What a run sees: a root of its own, read-only, holding only the system's `/usr` (and the
`/bin`, `/lib`... links into it), the interpreter's prefixes (its standard library and the
venv whose packages are the code's), the sandbox's own child script, a fresh `/dev` and the
`/proc` of its own PID namespace, and its work directory, the one place it may write. So no
file of the host's (keys, other projects, Ray's session directory and the Unix sockets under
`/tmp/ray`) is there to read or connect to, and the sandbox's code cannot be rewritten even
where the code's user owns it (a user-owned venv): it is mounted read-only.

Namespaces: mount, PID, network (only a loopback that is down: no network, and no abstract
Unix socket of the host's, which a mount namespace alone would leave reachable), IPC, UTS,
and a user namespace when the server is not root. The run dies with bwrap, and bwrap with the
server. No capability is kept; `no_new_privs` is set (a set-uid binary gains nothing).

Processes: at most `PythonLimits.processes` (RLIMIT_NPROC, set by the child). The kernel
counts them per user and user namespace and never enforces the limit for root, so a server
running as root runs each concurrent run as an unprivileged user of its own
(`SANDBOX_UID_BASE` + its slot): the child sets that user before the code runs (bwrap keeps
it the two capabilities that takes, then none is left). A server that is not root runs the
code as itself in a user namespace of its own, which the kernel counts apart.

Where bwrap is missing or cannot make its namespaces (a container without the privilege to),
`bwrap_works` says so and `serve-app-tools` refuses to start its python tool unless told to
run it unsandboxed (`--python-sandbox none`). Linux only. Standard library only.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# The user of a root server's runs: one per concurrent run, far above any account's (no
# account needs to exist: the kernel counts processes by number).
SANDBOX_UID_BASE = 1_900_000_000
# Where the system's tools and libraries are; a link (merged /usr) is made as a link.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
# Files a dynamic program reads at start, when the host has them.
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
NAMESPACES = (
    "--unshare-ipc",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-uts",
    "--unshare-cgroup-try",
)
# The sandbox's init dies with bwrap; the code's session is its own (no TIOCSTI into ours).
LIFETIME = ("--die-with-parent", "--new-session")
# What a root server's child needs to become its run's user (then it has none).
SET_USER_CAPS = ("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID")


@dataclass(frozen=True)
class SandboxUser:
    """The user a root server's run becomes (None for a server that is not root)."""

    uid: int
    gid: int


def sandbox_user(slot: int, server_uid: int) -> SandboxUser | None:
    """The user run ``slot`` runs as: one of its own when the server is root, else None
    (the server's own, in a user namespace)."""
    if server_uid != 0:
        return None
    return SandboxUser(SANDBOX_UID_BASE + slot, SANDBOX_UID_BASE + slot)


def bwrap() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def interpreter_dirs(python: str) -> tuple[str, ...]:
    """The folders ``python`` runs from: its prefixes (the venv's and the installation's),
    as it reports them, and its executable's, each once (none under another). Never ``/``:
    a sandbox showing the whole host would be none."""
    probe = (
        "import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix,"
        " sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]))"
    )
    found = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, check=True)
    dirs = [os.path.realpath(path) for path in json.loads(found.stdout)]
    dirs += [os.path.dirname(os.path.abspath(python))]  # the path named (a venv's bin/)
    if "/" in dirs:
        raise RuntimeError(f"{python}'s prefix is /: no sandbox can hold it")
    return tuple(_outermost(dirs))


def _outermost(paths: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path == outer or path.startswith(outer + "/") for outer in kept):
            kept.append(path)
    return kept


def command(python: str, child: Path, workdir: Path, user: SandboxUser | None) -> list[str]:
    """bwrap's arguments for one run in ``workdir`` (``--`` ends them: the interpreter's
    command follows). Raises RuntimeError when bwrap is not installed."""
    binary = bwrap()
    if binary is None:
        raise RuntimeError("bwrap is not installed (Debian: apt-get install bubblewrap)")
    args = [binary, *NAMESPACES, *LIFETIME]
    args += ["--unshare-user"] if user is None else list(SET_USER_CAPS)
    files = [path for path in SYSTEM_FILES if os.path.exists(path)]
    shown = [*interpreter_dirs(python), str(child), str(workdir), *files]
    args += _parents(shown)  # traversable by the run's user: bwrap makes them 0700 otherwise
    args += _system()
    for path in interpreter_dirs(python):
        if not _under_system(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind", str(child), str(child)]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--bind", str(workdir), str(workdir), "--chdir", str(workdir)]
    args += ["--remount-ro", "/"]
    return [*args, "--"]


def _system() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in SYSTEM_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", os.path.realpath(path), path]
    return args


def _under_system(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in SYSTEM_DIRS)


def _parents(paths: Iterable[str]) -> list[str]:
    """``--dir`` for every folder above ``paths`` (not the system's), made 0755, in order."""
    made: list[str] = []
    for path in paths:
        parts = Path(path).parts[1:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/" + "/".join(parts[:depth])
            if folder not in made and not _under_system(folder):
                made.append(folder)
    return [arg for folder in made for arg in ("--perms", "0755", "--dir", folder)]


@functools.cache
def bwrap_works(python: str) -> bool:
    """Whether a sandbox can be made here and ``python`` starts in it (checked once)."""
    if bwrap() is None:
        return False
    user = sandbox_user(0, os.geteuid())
    try:
        with tempfile.TemporaryDirectory(prefix="serve-app-sandbox-probe-") as folder:
            args = command(python, Path(__file__), Path(folder), user)
            probe = [*args, python, "-I", "-c", "pass"]
            done = subprocess.run(probe, capture_output=True, timeout=30)
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return False
    return done.returncode == 0
