"""The HTTP client one MCP session uses: every request goes to the address the policy checked
(the name is never resolved again: no DNS rebinding between the check and the connection),
to the session's server only, and every response is counted as it arrives and cut off past
its bound (never buffered whole first).

The `mcp` SDK's transports take an ``httpx2.AsyncClient`` (``streamable_http_client``'s
``http_client``, ``sse_client``'s ``httpx_client_factory``); this module builds it around a
transport that rewrites each request's host to the pinned address, keeping the name in the
``Host`` header and as the TLS server name (httpcore's ``sni_hostname``), so a certificate is
still verified against the name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Callable, Mapping

import httpx2

from serve_app.serving.tools.mcp.policy import IPAddress, ServerAddress, is_routing_header

# Asked of every server: a compressed body could decode to far more than it counts.
_IDENTITY = {"accept-encoding": "identity"}
# How long the rest of a POST's event stream is read once its reader stopped (the server ends
# it right after the answer): then the connection is dropped instead of kept.
POST_DRAIN_S = 0.5


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS context of every session (certificates verified against the system's or
    $SSL_CERT_FILE's authorities): made once, as loading the authorities costs ~30 ms of CPU,
    which each call would otherwise pay."""
    return httpx2.create_ssl_context(trust_env=True)


class Guard:
    """The first failure an operation's transport saw (a response over its bound, a request
    to another host), kept to be the operation's error: the SDK may turn a transport's
    exception into a vaguer one, or into none. ``on_failure`` is told at once (the operation
    cancels itself rather than wait for the SDK to notice)."""

    def __init__(self) -> None:
        self.failure: str | None = None
        self.on_failure: Callable[[], None] | None = None
        # The HTTP status of the last error answer to a message (the streamable HTTP
        # transport reports one as a generic JSON-RPC error: this says which).
        self.http_status: int | None = None

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            if self.on_failure is not None:
                self.on_failure()


class _BoundedStream(httpx2.AsyncByteStream):
    """A response body that fails once it has carried more than ``limit`` bytes; an event
    stream, once one of its events has (a session's stream stays open across operations, each
    answer one event: the bound is on what one answer may carry)."""

    def __init__(
        self,
        inner: httpx2.AsyncByteStream,
        limit: int,
        guard: Guard,
        per_event: bool = False,
        drain_s: float = 0.0,
    ) -> None:
        self._inner = inner
        self._limit = limit
        self._guard = guard
        self._per_event = per_event
        self._drain_s = drain_s
        self._chunks: AsyncIterator[bytes] | None = None
        self._exhausted = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        self._chunks = self._read()
        return self._chunks

    async def aclose(self) -> None:
        """Closed before its end (the `mcp` SDK stops reading a POST's event stream at the
        answer it waited for, a moment before the server ends the stream): the rest is read,
        for ``drain_s`` at most, so the connection is kept for the session's next request
        rather than dropped (a TCP connect for every call, a third of a call's CPU)."""
        if self._drain_s and self._chunks is not None and not self._exhausted:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._drain_s):
                    async for _ in self._chunks:
                        pass
        await self._inner.aclose()

    async def _read(self) -> AsyncIterator[bytes]:
        seen = 0
        tail = b""  # the end of the last chunk: an event's end may straddle two chunks
        async for chunk in self._inner:
            seen += len(chunk)
            if self._per_event:
                joined = tail + chunk
                end = max(joined.rfind(b"\n\n") + 2, joined.rfind(b"\r\n\r\n") + 4)
                if end > 3:  # an event ended in this chunk: count from there
                    seen = len(joined) - end
                tail = joined[-3:]
            if seen > self._limit:
                what = (
                    "an event of the MCP server's stream"
                    if self._per_event
                    else "the MCP server's response"
                )
                reason = f"{what} exceeded {self._limit} bytes"
                self._guard.fail(reason)
                raise httpx2.ReadError(reason)
            yield chunk
        self._exhausted = True


class PinnedTransport(httpx2.AsyncBaseTransport):
    """Sends requests for ``address``'s host and port to ``ip``, refuses any other, and
    bounds each response to ``max_response_bytes``."""

    def __init__(
        self, address: ServerAddress, ip: IPAddress, max_response_bytes: int, guard: Guard
    ) -> None:
        self._address = address
        self._ip = ip
        self._limit = max_response_bytes
        self._guard = guard
        # No proxy (one would resolve the name itself), no retries; the process's TLS context.
        self._inner = httpx2.AsyncHTTPTransport(verify=tls_context(), trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        if (url.scheme, url.host.rstrip(".").lower(), port) != (
            self._address.scheme,
            self._address.host,
            self._address.port,
        ):
            reason = "the MCP server sent the client to another origin; refused"
            self._guard.fail(reason)
            raise httpx2.ConnectError(reason, request=request)
        pinned = httpx2.Request(
            request.method,
            url.copy_with(host=str(self._ip)),
            headers=request.headers,  # its Host header still names the server
            stream=request.stream,
            extensions={**request.extensions, "sni_hostname": self._address.host},
        )
        response = await self._inner.handle_async_request(pinned)
        if response.status_code >= 400 and request.method == "POST":
            self._guard.http_status = response.status_code
        encoding = response.headers.get("content-encoding", "identity").lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            reason = f"the MCP server answered with a compressed body ({encoding}); refused"
            self._guard.fail(reason)
            raise httpx2.DecodingError(reason, request=request)
        stream = response.stream
        if not isinstance(stream, httpx2.AsyncByteStream):  # never, from an async transport
            raise httpx2.ReadError("the MCP server's response is not a stream", request=request)
        events = response.headers.get("content-type", "").lower().startswith("text/event-stream")
        # A POST's event stream ends right after its answer: drained on close (a GET's, the
        # session's own, stays open: not waited for).
        drain_s = POST_DRAIN_S if events and request.method == "POST" else 0.0
        bounded = _BoundedStream(stream, self._limit, self._guard, events, drain_s)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=bounded,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def pinned_client(
    address: ServerAddress,
    ip: IPAddress,
    headers: Mapping[str, str],
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_response_bytes: int,
    guard: Guard,
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` for one MCP session with ``address``'s server at ``ip``,
    sending ``headers`` (its credentials) to that server only, never a hop-by-hop or routing
    one: the door refuses those (a 400), and this holds for any caller past it too."""
    sent = {name: value for name, value in headers.items() if not is_routing_header(name)}
    return httpx2.AsyncClient(
        transport=PinnedTransport(address, ip, max_response_bytes, guard),
        headers={**_IDENTITY, **sent},
        timeout=httpx2.Timeout(connect_timeout_s, read=read_timeout_s),
        trust_env=False,
        follow_redirects=False,
    )
