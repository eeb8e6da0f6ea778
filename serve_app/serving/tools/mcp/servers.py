"""Whom the MCP client speaks to, and how much at once: a server as a request names it
(`McpServer`: its URL, the headers sent to it, who asks) with the keys its sessions and its
bound on calls in flight are kept by, and that bound (`Slots`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

from serve_app.serving.tools.mcp.policy import parse_server_url


@dataclass(frozen=True)
class McpServer:
    """One MCP server as a request names it: its URL and the headers sent to it (its
    ``authorization`` among them). The repr shows the URL only."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    # Who asks (the digest of the API key; None for an open API): sessions and the bound on
    # calls in flight are per owner.
    owner: str | None = None

    @classmethod
    def for_tool(
        cls,
        server_url: str,
        headers: Mapping[str, str] | None = None,
        authorization: str | None = None,
        owner: str | None = None,
    ) -> McpServer:
        """The server of a request's `mcp` tool (``server_url``, ``headers``, ``authorization``:
        an OAuth access token, sent as ``Authorization: Bearer``) for ``owner``."""
        sent = dict(headers or {})
        if authorization:
            sent = {name: value for name, value in sent.items() if name.lower() != "authorization"}
            sent["Authorization"] = f"Bearer {authorization}"
        return cls(server_url, sent, owner)

    @property
    def transport(self) -> Literal["streamable_http", "sse"]:
        path = parse_server_url(self.url).path.rstrip("/")
        return "sse" if path.endswith("/sse") else "streamable_http"

    @property
    def key(self) -> str:
        """The server and its credentials for its owner, as one opaque key (calls in flight
        are bounded per key): the owner, the URL and a digest of the ``Authorization`` header,
        never the header itself, and no other header (one the request chooses, such as the
        browser's ``x-session-id`` or junk, is not a pool of its own)."""
        credentials = [v for name, v in self.headers.items() if name.lower() == "authorization"]
        return _opaque_key(self.owner, self.url, credentials)

    @property
    def session_key(self) -> str:
        """What a session is kept by: the owner, the URL and a digest of every header (a
        session sends its own headers: another header is another session)."""
        return _opaque_key(self.owner, self.url, sorted(self.headers.items()))

    def redact(self, text: str) -> str:
        """``text`` with every header value in it blanked (a server may echo one back)."""
        for value in self.headers.values():
            # The whole value first, then the token alone: one outcome, whatever the order.
            for secret in sorted(
                {value, value.removeprefix("Bearer ").strip()}, key=len, reverse=True
            ):
                if len(secret) >= 4:
                    text = text.replace(secret, "[redacted]")
        return text


class Slots:
    """Calls in flight per server key, at most ``limit`` each; a key's semaphore lives while
    someone holds or awaits it, so keys (one per server and credentials) never pile up."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._semaphores: dict[str, tuple[asyncio.Semaphore, int]] = {}
        self._active: dict[str, int] = {}

    def active(self, key: str) -> int:
        return self._active.get(key, 0)

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        semaphore, users = self._semaphores.get(key, (asyncio.Semaphore(self._limit), 0))
        self._semaphores[key] = (semaphore, users + 1)
        try:
            async with semaphore:
                self._active[key] = self._active.get(key, 0) + 1
                try:
                    yield
                finally:
                    self._active[key] -= 1
                    if not self._active[key]:
                        del self._active[key]
        finally:
            semaphore, users = self._semaphores[key]
            if users == 1:
                del self._semaphores[key]
            else:
                self._semaphores[key] = (semaphore, users - 1)


def _opaque_key(owner: str | None, url: str, secret: object) -> str:
    digest = hashlib.sha256(json.dumps([owner, secret]).encode()).hexdigest()
    return f"{url}#{digest[:32]}"
