"""A throwaway PostgreSQL server on loopback for the store tests (or a reason there is none)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.serve_run import free_port

SERVER_USER = "postgres"  # Debian's package creates it; initdb refuses to run as root


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", SERVER_USER, "--", *command]


def start() -> tuple[str, Path]:
    """Start a server; returns (SQLAlchemy URL, data dir). Raises RuntimeError if it cannot."""
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if not (initdb and pg_ctl):
        raise RuntimeError("initdb/pg_ctl not found (install Debian's postgresql)")
    # Directly under /tmp: pytest's own temp folders are private to root, and the server
    # runs as the postgres user.
    data = Path(tempfile.mkdtemp(prefix="serve_app_pg_"))
    if os.geteuid() == 0:
        shutil.chown(data, SERVER_USER)
    port = free_port()
    run = {"check": True, "capture_output": True, "text": True, "timeout": 120}
    subprocess.run(
        _as_server_user([initdb, "-D", str(data), "-U", "postgres", "--auth=trust"]), **run
    )
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        _as_server_user(
            [pg_ctl, "-D", str(data), "-o", options, "-w", "-l", str(data / "log"), "start"]
        ),
        **run,
    )
    return f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres", data


def stop(data: Path) -> None:
    pg_ctl = _binary("pg_ctl")
    if pg_ctl:
        subprocess.run(
            _as_server_user([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
            timeout=60,
        )
