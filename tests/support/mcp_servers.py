"""MCP servers for tests and benchmarks, built with the `mcp` SDK's own server classes
(`MCPServer`, its streamable HTTP and SSE apps), each in a subprocess on 127.0.0.1 and a free
port, started and stopped by the test.

    from tests.support.mcp_servers import mcp_server

    with mcp_server("good") as server:              # streamable HTTP: server.url ends in /mcp
        ...                                          # allow server.url, name it in an mcp tool
    with mcp_server("good", transport="sse") as server:   # SSE: server.url ends in /sse
        ...

Kinds (`KINDS`), each also listing `echo` unless said otherwise:
- ``good``: ``echo(text)``, ``add(a, b)``, ``slow(seconds)`` (sleeps, then says so),
  ``fail(message)`` (an ``isError`` result with that message), ``seen_headers()`` (the
  ``authorization`` and ``x-*`` header values every HTTP request to this server carried, and
  any ``Host`` but its own loopback address, ``Forwarded``, ``Via`` or ``Proxy-*``, JSON),
  ``charge(amount)`` (a side effect: counts the charges made, answers ``charge #N of AMOUNT``)
  and ``charges()`` (how many were made: what an exactly-once test reads);
- ``hang``: ``hang()`` never answers;
- ``huge``: ``huge(mib=10)`` answers that many MiB of text;
- ``drop``: ``drop()`` ends the server's process mid-call (connections closed, no answer);
- ``many``: 500 tools ``tool_000`` ... ``tool_499`` (each echoes ``text``), and no ``echo``;
- ``silent``: a TCP server that accepts connections and never answers a byte (no MCP at all).

``token="t"``: every HTTP request without ``Authorization: Bearer t`` is a 401.
``server.session_stats()``: the MCP sessions clients used and ended (GET ``/_stats``).
``json_response=True`` (streamable HTTP): answers are JSON bodies instead of SSE streams.
The server's process ends with its ``stop()``, and on its own if the test process dies (it
watches its stdin). ``python -m tests.support.mcp_servers KIND [--transport sse]`` runs one
by hand and prints its URL.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.support import REPO

Transport = Literal["streamable-http", "sse"]
KINDS = ("good", "hang", "huge", "drop", "many", "silent")
PATHS: dict[str, str] = {"streamable-http": "/mcp", "sse": "/sse"}
MANY_TOOLS = 500
START_TIMEOUT_S = 60.0


@dataclass
class McpTestServer:
    """One running test server: ``url`` is what an `mcp` tool's ``server_url`` names."""

    kind: str
    transport: Transport
    host: str
    port: int
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{PATHS[self.transport]}"

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``: an allowlist entry covering this server only."""
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def session_stats(self) -> tuple[set[str], set[str]]:
        """The MCP sessions clients used with this server (by ``mcp-session-id``), and those
        they ended (DELETE): streamable HTTP only."""
        with urllib.request.urlopen(f"{self.origin}{STATS_PATH}", timeout=10) as answer:
            stats = json.loads(answer.read())
        return set(stats["sessions"]), set(stats["ended"])

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_mcp_server(
    kind: str = "good",
    transport: Transport = "streamable-http",
    *,
    token: str | None = None,
    json_response: bool = False,
    port: int = 0,
) -> McpTestServer:
    """Start a test server in a subprocess and return once it accepts MCP requests; the
    caller stops it (or use `mcp_server`). ``port``: a given one (a running app's allowlist
    names it), else a free one."""
    if kind not in KINDS:
        raise ValueError(f"unknown MCP test server kind {kind!r}; one of {KINDS}")
    # The port is bound here and the socket handed to the child: no race for a free port.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    port = listener.getsockname()[1]
    command = [sys.executable, "-m", "tests.support.mcp_servers", kind, "--transport", transport]
    command += ["--fd", str(listener.fileno())]
    if token is not None:
        command += ["--token", token]
    if json_response:
        command.append("--json-response")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=(listener.fileno(),),
        cwd=REPO,
        env=env,
    )
    listener.close()
    server = McpTestServer(kind, transport, "127.0.0.1", port, process)
    try:
        _await_ready(process)
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def mcp_server(
    kind: str = "good",
    transport: Transport = "streamable-http",
    *,
    token: str | None = None,
    json_response: bool = False,
    port: int = 0,
) -> Iterator[McpTestServer]:
    """`start_mcp_server`, stopped on leaving."""
    server = start_mcp_server(kind, transport, token=token, json_response=json_response, port=port)
    try:
        yield server
    finally:
        server.stop()


def _await_ready(process: subprocess.Popen[bytes]) -> None:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline() if ready else b""
    if line.strip() != b"ready":
        raise RuntimeError(f"the MCP test server did not start (exit code {process.poll()})")


# ---- the child process ----------------------------------------------------------------------


def _build_server(kind: str) -> Any:
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer(name=f"test-{kind}", log_level="WARNING")
    if kind != "many":

        @server.tool(description="Answers the text it is given.")
        def echo(text: str) -> str:
            return text

    if kind == "good":

        @server.tool(description="Adds two integers.")
        def add(a: int, b: int) -> int:
            return a + b

        @server.tool(description="Sleeps this many seconds, then answers.")
        async def slow(seconds: float) -> str:
            await anyio.sleep(seconds)
            return f"slept {seconds}s"

        @server.tool(description="Fails with this message.")
        def fail(message: str) -> str:
            raise ToolError(message)  # the SDK answers isError with this message

        @server.tool(description="The authorization and x-* header values this server was sent.")
        def seen_headers() -> str:
            return json.dumps(sorted(_SEEN_HEADERS))

        @server.tool(description="Charges this amount (a side effect; counted).")
        def charge(amount: int) -> str:
            _CHARGES.append(amount)
            return f"charge #{len(_CHARGES)} of {amount}"

        @server.tool(description="How many charges were made.")
        def charges() -> str:
            return str(len(_CHARGES))

    elif kind == "hang":

        @server.tool(description="Never answers.")
        async def hang() -> str:
            await anyio.sleep_forever()
            return "unreachable"

    elif kind == "huge":

        @server.tool(description="Answers this many MiB of text.")
        def huge(mib: float = 10) -> str:
            return "x" * int(mib * 1024 * 1024)

    elif kind == "drop":

        @server.tool(description="Ends the server mid-call.")
        async def drop() -> str:
            await anyio.sleep(0.05)
            os._exit(3)

    elif kind == "many":
        for index in range(MANY_TOOLS):
            server.add_tool(_echo_as, name=f"tool_{index:03d}", description=f"Tool number {index}.")
    return server


def _echo_as(text: str) -> str:
    return text


# Header values the server was sent (the `good` kind's `seen_headers` answers them).
_SEEN_HEADERS: set[str] = set()
# The amounts `charge` was called with, in order (`charges` answers how many).
_CHARGES: list[int] = []
# The MCP sessions clients used (their `mcp-session-id`s), and those they ended (DELETE).
_SESSIONS: set[str] = set()
_ENDED: set[str] = set()
# GET here: the sessions seen and ended so far, as JSON (`session_stats`), not MCP.
STATS_PATH = "/_stats"


async def _send_stats(send: Any) -> None:
    body = json.dumps({"sessions": sorted(_SESSIONS), "ended": sorted(_ENDED)}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _foreign(name: str, value: str) -> bool:
    """A routing header a client should never have chosen: a ``Host`` other than this
    server's own loopback address, or any ``Forwarded``/``Via``/``Proxy-*``."""
    if name == "host":
        return not value.startswith(("127.0.0.1:", "localhost:"))
    return name in ("forwarded", "via") or name.startswith("proxy-")


def _guarded(app: Any, token: str | None) -> Any:
    """The ASGI app, noting the headers each request carries and, with a token, refusing
    requests without it."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == STATS_PATH:
            await _send_stats(send)
            return
        if scope["type"] == "http":
            headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
            for name, value in headers.items():
                if name == "authorization" or name.startswith("x-") or _foreign(name, value):
                    _SEEN_HEADERS.add(f"{name}: {value}")
            session = headers.get("mcp-session-id")
            if session is not None:
                _SESSIONS.add(session)
                if scope["method"] == "DELETE":
                    _ENDED.add(session)
            if token is not None and headers.get("authorization") != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


def _watch_parent() -> None:
    """End this process when the test process goes (its end of stdin closes)."""
    sys.stdin.buffer.read()
    os._exit(0)


async def _serve(
    kind: str, transport: Transport, sock: socket.socket, token: str | None, json_response: bool
) -> None:
    import anyio
    import uvicorn

    if kind == "silent":
        await _serve_silently(sock)
        return
    server = _build_server(kind)
    if transport == "sse":
        app = server.sse_app()
    else:
        app = server.streamable_http_app(json_response=json_response)
    config = uvicorn.Config(_guarded(app, token), log_level="warning", lifespan="on")
    uvicorn_server = uvicorn.Server(config)
    async with anyio.create_task_group() as group:
        group.start_soon(uvicorn_server.serve, [sock])
        while not uvicorn_server.started:
            await anyio.sleep(0.01)
        _say_ready()


async def _serve_silently(sock: socket.socket) -> None:
    import asyncio

    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # kept open, never written to

    server = await asyncio.start_server(hold, sock=sock)
    _say_ready()
    async with server:
        await server.serve_forever()


def _say_ready() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def main() -> None:
    import anyio

    parser = argparse.ArgumentParser(description="Run one MCP test server.")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--transport", choices=tuple(PATHS), default="streamable-http")
    parser.add_argument("--fd", type=int, help="a listening socket's descriptor (else a free port)")
    parser.add_argument("--token")
    parser.add_argument("--json-response", action="store_true")
    args = parser.parse_args()
    if args.fd is not None:
        sock = socket.socket(fileno=args.fd)
        threading.Thread(target=_watch_parent, daemon=True).start()
    else:
        sock = socket.create_server(("127.0.0.1", 0))
        host, port = sock.getsockname()[:2]
        print(f"http://{host}:{port}{PATHS[args.transport]}", file=sys.stderr, flush=True)
    anyio.run(_serve, args.kind, args.transport, sock, args.token, args.json_response)


if __name__ == "__main__":
    main()
