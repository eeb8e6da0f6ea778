"""``serve run`` as users start it: started on a config, awaited until ``/health`` answers,
joined (this process on its Ray cluster, not any other on the machine), and stopped with Ctrl-C.

One implementation for the serve tier's session app (tests/conftest.py), the store soak
(loadtests/soak_store.py), the streaming benchmark (loadtests/bench_stream.py) and the GPU smoke
test (scripts/gpu_smoke.py). It lives with the tests because all four have the repository's root
on ``sys.path`` as they are run (pytest from the root; the load tests with ``PYTHONPATH=.``, as
docs/benchmarks.md runs them; scripts/gpu_smoke.sh exports it), and it is tooling, not the app:
it imports nothing of serve_app, so it runs wherever ``serve`` does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support import REPO

STARTUP_TIMEOUT_S = 180
STOP_TIMEOUT_S = 60
LOG_TAIL = 5000  # characters of `serve run`'s output an error shows


@dataclass
class ServeRun:
    """A running ``serve run``: its process (the leader of a session of its own), its URL, its
    output."""

    process: subprocess.Popen
    url: str
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-LOG_TAIL:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(config: dict[str, Any], folder: Path, env: Mapping[str, str] | None = None) -> ServeRun:
    """``serve run`` on ``config`` (written to ``folder``), in a session of its own so that
    Ctrl-C reaches it and the local Ray cluster it starts; its output in ``folder/serve.log``.
    ``env`` adds to this process's environment."""
    path = folder / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    log = folder / "serve.log"
    serve = Path(sys.executable).parent / "serve"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(serve), "run", str(path)],
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ServeRun(process, f"http://127.0.0.1:{config['http_options']['port']}", log)


def wait_healthy(run: ServeRun, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Until the app answers ``/health``; a ``serve run`` that exits or a timeout raises
    RuntimeError with the end of its output."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.process.poll() is not None:
            raise RuntimeError(f"serve run exited:\n{run.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{run.url}/health", timeout=2).status_code == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"the app did not become healthy in {timeout_s}s:\n{run.log_tail()}")


def stop(run: ServeRun, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Ctrl-C, as users stop ``serve run``: it shuts the app and its local Ray down; killed if
    it has not within ``timeout_s``. Then whatever it started and left running is killed."""
    if run.process.poll() is None:
        os.killpg(run.process.pid, signal.SIGINT)
        try:
            run.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(run.process.pid, signal.SIGKILL)
            run.process.wait()
    end_leftovers(run.process.pid)


def end_leftovers(session: int) -> list[str]:
    """Kills the processes still in the session ``serve run`` led, once it has exited, and says
    which on stderr; returns their command lines. Ray starts some in process groups of their
    own, which Ctrl-C does not reach: Serve's HAProxy, in its manager's group, has outlived a
    fast-path run once in CI (its manager stops it at shutdown, unless it is mid-reload or is
    itself killed), holding its ports for good. Linux only (``/proc``)."""
    left = []
    for pid, argv in processes():
        if not any(argv):
            continue  # ended: a zombie until its parent, or init, reaps it
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to see
            if os.getsid(pid) == session:
                os.kill(pid, signal.SIGKILL)
                left.append(b" ".join(argv).decode(errors="replace").strip())
    if left:
        print(f"serve run left {len(left)} process(es) running; killed:", file=sys.stderr)
        for command in left:
            print(f"  {command[:200]}", file=sys.stderr)
    return left


@contextlib.contextmanager
def running(
    config: dict[str, Any],
    folder: Path,
    env: Mapping[str, str] | None = None,
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
    stop_timeout_s: float = STOP_TIMEOUT_S,
) -> Iterator[ServeRun]:
    """``serve run`` on ``config``, healthy, for the ``with`` block; stopped after it."""
    run = start(config, folder, env)
    try:
        wait_healthy(run, startup_timeout_s)
        yield run
    finally:
        stop(run, stop_timeout_s)


def processes() -> Iterator[tuple[int, list[bytes]]]:
    """Every process with its command line (from /proc)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # it ended meanwhile
            continue
        yield int(proc.name), argv


def children(pid: int) -> Iterator[tuple[int, list[bytes]]]:
    """The processes whose parent is ``pid``, with their command lines (from /proc)."""
    for child, argv in processes():
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            yield child, argv


def raylet(run: ServeRun) -> tuple[int, list[bytes]]:
    """The raylet of the cluster this ``serve run`` started: a child process of it."""
    for pid, argv in children(run.process.pid):
        if argv and argv[0].endswith(b"raylet/raylet"):
            return pid, argv
    raise RuntimeError("could not find the Ray cluster started by `serve run`")


def gcs_address(run: ServeRun) -> str:
    """The address of the Ray cluster this ``serve run`` started (not any other on the
    machine): its raylet's command line names it."""
    _, argv = raylet(run)
    for arg in argv:
        if arg.startswith(b"--gcs-address="):
            return arg.split(b"=", 1)[1].decode()
    raise RuntimeError("the raylet of `serve run` names no GCS address")


def join(run: ServeRun, **init_options: Any) -> None:
    """This process joins the cluster this ``serve run`` started, as a driver (``ray.init``;
    ``ray.shutdown()`` leaves it)."""
    import ray
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    # `serve run` started its cluster with Ray's token authentication on (the default for a
    # new local cluster, its token in ~/.ray/auth_token); a driver joining it must use it too.
    # ray.init turns it on for address="auto" only, with this function (no public API does it
    # for an address given; setting RAY_AUTH_MODE=token here instead is too late in a process
    # that used Ray already: Ray has read it by then, as the serve tier showed).
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    ray.init(address=gcs_address(run), **{"logging_level": "ERROR", **init_options})
