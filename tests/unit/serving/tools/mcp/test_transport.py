"""The HTTP client of an MCP session: it connects to the address the policy checked (a name is
never resolved again between the check and the connection), talks to its server's origin
only, and cuts a response off past its bound as it arrives."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest

from serve_app.config import ToolArgs
from serve_app.serving.tools.mcp import McpClient, McpServer
from serve_app.serving.tools.mcp.policy import parse_server_url
from serve_app.serving.tools.mcp.transport import Guard, _BoundedStream, pinned_client
from tests.support.mcp_servers import McpTestServer, mcp_server

REAL_GETADDRINFO = socket.getaddrinfo


@pytest.fixture(scope="module")
def good() -> Iterator[McpTestServer]:
    with mcp_server("good") as server:
        yield server


def _resolver(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> list[str]:
    """Names resolve to ``answers[name]`` once each; asked again, they fail (a rebinding
    attacker's second answer would differ: any second resolution is a bug)."""
    asked: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if isinstance(host, bytes):
            host = host.decode()
        try:
            ipaddress.ip_address(host)
            return REAL_GETADDRINFO(host, port, *args, **kwargs)  # a literal: no lookup
        except ValueError:
            pass
        asked.append(host)
        if host not in answers or asked.count(host) > 1:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        family = socket.AF_INET6 if ":" in answers[host][0] else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in answers[host]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


async def test_the_connection_goes_to_the_checked_address(
    good: McpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://localhost:{good.port}/mcp"
    client = McpClient(ToolArgs(mcp_allow=[f"http://localhost:{good.port}"]))
    asked = _resolver(monkeypatch, {"localhost": ["127.0.0.1"]})
    outcome = await client.call_tool(McpServer(url), "echo", {"text": "pinned"})
    assert outcome.output == "pinned", outcome.message
    assert asked == ["localhost"]  # resolved once, by the check


async def test_an_allowed_name_resolving_to_metadata_is_never_connected(
    good: McpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = McpClient(ToolArgs(mcp_allow=["http://tools.example.com"]))
    _resolver(monkeypatch, {"tools.example.com": ["169.254.169.254"]})
    outcome = await client.call_tool(
        McpServer("http://tools.example.com/mcp"), "echo", {"text": "x"}
    )
    assert outcome.error is not None and "169.254.169.254" in outcome.message
    assert "link-local" in outcome.message


async def test_a_public_name_resolving_to_loopback_is_refused(
    good: McpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = McpClient(ToolArgs(mcp_allow=[f"http://tools.example.com:{good.port}"]))
    _resolver(monkeypatch, {"tools.example.com": ["127.0.0.1"]})
    listing = await client.list_tools(McpServer(f"http://tools.example.com:{good.port}/mcp"))
    assert listing.error is not None and "loopback" in listing.error
    seen = await McpClient(ToolArgs(mcp_allow=[good.origin])).call_tool(
        McpServer(good.url), "seen_headers", {}
    )
    assert seen.output == "[]"  # nothing reached the server with that name's requests


async def test_a_request_to_another_origin_is_refused(good: McpTestServer) -> None:
    address = parse_server_url(good.url)
    guard = Guard()
    client = pinned_client(
        address,
        ipaddress.ip_address("127.0.0.1"),
        {"Authorization": "Bearer secret"},
        connect_timeout_s=2,
        read_timeout_s=2,
        max_response_bytes=1000,
        guard=guard,
    )
    async with client:
        with pytest.raises(httpx2.ConnectError):
            await client.get(f"http://127.0.0.1:{good.port + 1}/mcp")
        with pytest.raises(httpx2.ConnectError):
            await client.get(f"https://127.0.0.1:{good.port}/mcp")
    assert guard.failure is not None and "another origin" in guard.failure


class _Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: int, size: int) -> None:
        self.pulled = 0
        self._chunks = chunks
        self._size = size

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self._chunks):
            self.pulled += 1
            yield b"x" * self._size


async def test_a_response_is_cut_off_at_its_bound_as_it_arrives() -> None:
    source = _Chunks(10, 1024 * 1024)
    guard = Guard()
    failures: list[str] = []
    guard.on_failure = lambda: failures.append("told")
    received = 0
    with pytest.raises(httpx2.ReadError, match="exceeded 2621440 bytes"):
        async for chunk in _BoundedStream(source, 2621440, guard):
            received += len(chunk)
    assert received == 2 * 1024 * 1024 and source.pulled == 3  # not one chunk more than needed
    assert failures == ["told"] and guard.failure is not None


async def test_a_compressed_answer_is_refused() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 3\r\n\r\nabc")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    guard = Guard()
    client = pinned_client(
        parse_server_url(f"http://127.0.0.1:{port}/mcp"),
        ipaddress.ip_address("127.0.0.1"),
        {},
        connect_timeout_s=2,
        read_timeout_s=2,
        max_response_bytes=1000,
        guard=guard,
    )
    async with server, client:
        with pytest.raises(httpx2.DecodingError):
            await client.get(f"http://127.0.0.1:{port}/mcp")
    assert guard.failure is not None and "compressed" in guard.failure
