"""The reference tool server (serve_app/toolserver) as users start it, for the tests that call
it: `python -m serve_app.toolserver` on a free loopback port, awaited (`/health`), stopped.

    with tool_server(docs_folder, "--python-wall-seconds", "5") as server:
        server.mcp_url     # http://127.0.0.1:PORT/mcp (streamable HTTP); server.sse_url: /sse

Its output goes to `log` (a file beside the docs folder's parent unless given), shown when it
fails to start. Its python tool is sandboxed (bubblewrap) where this machine can make the
sandbox, else started with `--python-sandbox none`. The server is a process, not a module
here (only `bwrap_works` is asked of serve_app.toolserver).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from serve_app.toolserver.sandbox import bwrap_works
from tests.support import REPO
from tests.support.serve_run import free_port

STARTUP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ToolServer:
    process: subprocess.Popen
    url: str
    log: Path

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    @property
    def sse_url(self) -> str:
        return f"{self.url}/sse"


@contextlib.contextmanager
def tool_server(docs: Path | None, *args: str, log: Path | None = None) -> Iterator[ToolServer]:
    """The server on `docs` (None: `--tools python`, no browser) with CLI `args` added."""
    port = free_port()
    log = log or Path(tempfile.mkstemp(prefix="toolserver-", suffix=".log")[1])
    if "--python-sandbox" not in args and not bwrap_works(sys.executable):
        # No sandbox can be made here (no bubblewrap, no namespaces): the tests of what the
        # tools do run unsandboxed; the sandbox's own tests skip (test_sandbox.py).
        args = (*args, "--python-sandbox", "none")
    command = [sys.executable, "-m", "serve_app.toolserver", "--port", str(port)]
    command += ["--docs", str(docs)] if docs is not None else ["--tools", "python"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = ToolServer(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_healthy(server)
        yield server
    finally:
        _stop(server)


def _wait_healthy(server: ToolServer) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the tool server exited:\n{server.log.read_text()[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the tool server did not start:\n{server.log.read_text()[-4000:]}")


def _stop(server: ToolServer) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


@contextlib.asynccontextmanager
async def mcp_session(url: str, headers: dict[str, str] | None = None):
    """An initialized `mcp` ClientSession on the streamable HTTP endpoint `url`."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(30.0, read=300.0)
    async with (
        httpx2.AsyncClient(headers=headers or {}, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def text_of(result) -> str:
    """A CallToolResult's text (the tools answer with one text block)."""
    return "".join(block.text for block in result.content if block.type == "text")
