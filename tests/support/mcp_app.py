"""MCP servers the running app may reach in tests: one port per role, named in the app's
allowlist (``$SERVE_APP_MCP_ALLOW``, `ToolArgs.mcp_allow`'s override) before the app starts.

The serve tier's app (tests/conftest.py) inherits this process's environment: importing this
module picks free ports and sets the variable when it is unset. An app started apart (the
Ray-free local app) must be given the same list, and pytest too:

    export SERVE_APP_MCP_ALLOW=$(python -m tests.support.mcp_app)
    python -m tests.local_app --port 8123 &
    SERVE_APP_TEST_URL=http://127.0.0.1:8123 python -m pytest tests/app/test_mcp.py

`port(role)` is the role's port; `ROLES` lists them, in the variable's order.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

from serve_app.config import MCP_ALLOW_ENV
from tests.support import REPO

ROLES = ("good", "good_sse", "hang", "huge", "drop", "many", "everything", "agents", "closed")
ROLES = (*ROLES, "loop")  # tests/app/test_tool_loop.py
ROLES = (*ROLES, "once")  # tests/app/test_mcp_once.py
EVERYTHING = REPO / "tests" / "js" / "node_modules" / "@modelcontextprotocol" / "server-everything"


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def fresh_allowlist() -> str:
    return ",".join(f"http://127.0.0.1:{port}" for port in _free_ports(len(ROLES)))


def _ports() -> dict[str, int]:
    allow = os.environ.get(MCP_ALLOW_ENV)
    if not allow:
        allow = os.environ[MCP_ALLOW_ENV] = fresh_allowlist()
    ports = [urlsplit(entry.strip()).port for entry in allow.split(",") if entry.strip()]
    if len(ports) < len(ROLES) or None in ports:
        raise RuntimeError(
            f"${MCP_ALLOW_ENV} names {len(ports)} ports; the MCP tests need "
            f"{len(ROLES)}: `python -m tests.support.mcp_app` makes such a list"
        )
    return dict(zip(ROLES, ports, strict=False))  # type: ignore[arg-type]


PORTS = _ports()


def port(role: str) -> int:
    return PORTS[role]


@contextlib.contextmanager
def everything_server(role: str = "everything") -> Iterator[str]:
    """`@modelcontextprotocol/server-everything` (npm, tests/js) serving streamable HTTP on
    127.0.0.1 at the role's port; its URL. Skips when tests/js has no node_modules."""
    import pytest

    if not EVERYTHING.is_dir():
        pytest.skip("tests/js/node_modules lacks server-everything: `npm ci --prefix tests/js`")
    given = port(role)
    # The package listens on every interface; the preload binds it to loopback only.
    command = [
        "node",
        "--require",
        str(REPO / "tests" / "js" / "loopback_listen.cjs"),
        str(EVERYTHING / "dist" / "index.js"),
        "streamableHttp",
    ]
    process = subprocess.Popen(
        command,
        env={**os.environ, "PORT": str(given)},
        cwd=REPO / "tests" / "js",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", given), 1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server-everything did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{given}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


if __name__ == "__main__":
    print(fresh_allowlist())
