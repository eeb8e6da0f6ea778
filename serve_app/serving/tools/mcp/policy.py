"""What the server may reach: the operator's allowlist of MCP server URL prefixes
(`ToolArgs.mcp_allow`) checked when a request arrives, and the addresses a name resolves to,
checked when the server is reached (DNS rebinding).

A URL is under an entry when its scheme, host and port are the entry's and its path is the
entry's path or goes on below it at a ``/`` (``https://a.example/mcp`` covers
``https://a.example/mcp/v1``, not ``https://a.example/mcpx`` nor ``https://a.example.evil/``).

Addresses: link-local (169.254/16, fe80::/10, which hold the clouds' metadata services),
the metadata addresses outside it, unspecified, multicast and reserved ones are never reached;
private and loopback ones only through an entry that names such an address or ``localhost``
(tests and a sidecar on the same host), or through the operator's own entry for a tool server
it configured (`operator_entry`: a cluster Service's name resolves to a private ClusterIP);
every other address must be global. A name one of
whose addresses is refused is refused whole, and the connection goes to the address that was
checked, never to the name resolved again (transport.py pins it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import posixpath
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from serve_app.protocol.errors import InvalidRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_PORTS = {"http": 80, "https": 443}
# Metadata services outside link-local space: AWS's IPv6 one, Alibaba's (in 100.64/10),
# Azure's wire server (a public address), Oracle's.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in ("fd00:ec2::254", "100.100.100.200", "168.63.129.16", "192.0.0.192")
)
# Escapes that let one path read as another past a prefix match, once a server decodes them.
_PATH_TRICKS = re.compile(r"%2e|%2f|%5c|\\", re.IGNORECASE)
# Headers a request's `mcp` tool may not send: the hop-by-hop ones (RFC 9110, 7.6.1), which
# the HTTP client writes itself, and those a proxy or ingress in front of an allowed server
# routes or trusts by (`Host` picks its virtual host, `X-Forwarded-*` who is asking): a
# request's credentials go to the server the operator allowed, never choose another behind it.
_ROUTING_HEADERS = frozenset(
    {
        "host",
        "connection",
        "content-length",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "keep-alive",
        "forwarded",
        "via",
        "x-real-ip",
    }
)
_ROUTING_PREFIXES = ("proxy-", "x-forwarded-")


@dataclass(frozen=True)
class ServerAddress:
    """A URL split into what the allowlist compares: lower-case scheme and host (no trailing
    dot, IPv6 without brackets), the port (the scheme's default when absent), the path."""

    scheme: str
    host: str
    port: int
    path: str
    # The operator named this server in its own configuration (a tool server's URL), not a
    # request: its name may resolve to a private or loopback address (`operator_entry`).
    operator: bool = field(default=False, compare=False)

    def covers(self, other: ServerAddress) -> bool:
        """Whether ``other`` is under this entry."""
        if (self.scheme, self.host, self.port) != (other.scheme, other.host, other.port):
            return False
        prefix = self.path.rstrip("/")
        return other.path == prefix or other.path.startswith(prefix + "/")

    @property
    def ip(self) -> IPAddress | None:
        """The host, when it is an address literal."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    @property
    def names_private(self) -> bool:
        """Whether an entry for this host lets private and loopback addresses be reached."""
        if self.host == "localhost" or self.operator:
            return True
        ip = self.ip
        return ip is not None and (ip.is_private or ip.is_loopback)


def is_routing_header(name: str) -> bool:
    """Whether a request may not set header ``name`` (any case, spaces around it ignored)."""
    folded = name.strip().lower()
    return folded in _ROUTING_HEADERS or folded.startswith(_ROUTING_PREFIXES)


def check_headers(headers: Mapping[str, str] | None, param: str) -> None:
    """A 400 naming ``{param}.{name}`` (``tools[0].headers.Host``) for the first header a
    request may not set (`is_routing_header`)."""
    for name in headers or {}:
        if is_routing_header(name):
            named = f"{param}.{name}"
            raise InvalidRequest(
                f"Invalid '{named}': hop-by-hop and routing headers (Host, Connection, "
                "Content-Length, Transfer-Encoding, TE, Upgrade, Proxy-*, Forwarded, "
                "X-Forwarded-*...) are set by this server's HTTP client, not by a request.",
                param=named,
                code="invalid_value",
            )


class UnsafeAddress(Exception):
    """The server's name resolves to an address the server may not reach (or to none)."""


def parse_server_url(url: str) -> ServerAddress:
    """The URL's parts, or ValueError saying what is wrong with it."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as error:
        raise ValueError(f"is not a valid URL ({error})") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("must be an http or https URL")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError("must not carry credentials (send them in `headers` or `authorization`)")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise ValueError("has no host")
    path = parts.path or "/"
    if _PATH_TRICKS.search(path) or posixpath.normpath(path).lstrip("/") != path.strip("/"):
        raise ValueError("has a path with dot segments or escaped separators")
    return ServerAddress(scheme, host.lower(), port or DEFAULT_PORTS[scheme], path)


def operator_entry(url: str) -> ServerAddress:
    """The entry for a server the operator configured (``tools.browser_server_url``...): the
    URL itself, its name reached at the private or loopback address it resolves to (never a
    link-local or metadata one). Requests' URLs never get one: they stay under `mcp_allow`.
    ValueError when ``url`` is no http(s) URL."""
    return replace(parse_server_url(url), operator=True)


def check_server_url(url: str, param: str, allow: Sequence[str]) -> ServerAddress:
    """The allowlist entry covering ``url``; a 400 naming ``param`` (``tools[2].server_url``)
    when it is not an http(s) URL, carries credentials, or is under no entry of ``allow``.
    Made before any connection: a refused URL is never reached."""
    try:
        address = parse_server_url(url)
    except ValueError as error:
        raise InvalidRequest(
            f"Invalid '{param}': the URL {error}.", param=param, code="invalid_value"
        ) from None
    for entry in allow:
        try:
            allowed = parse_server_url(entry)
        except ValueError:
            continue  # ToolArgs validates entries; a bad one allows nothing
        if allowed.covers(address):
            return allowed
    reason = (
        "this server reaches no MCP servers (its operator allows none: tools.mcp_allow)"
        if not allow
        else "the URL is under no MCP server prefix this server's operator allows (tools.mcp_allow)"
    )
    raise InvalidRequest(f"Invalid '{param}': {reason}.", param=param, code="invalid_value")


def refusal(ip: IPAddress, entry: ServerAddress) -> str | None:
    """Why ``ip`` may not be reached through ``entry``, or None when it may."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_unspecified or ip.is_multicast or (ip.is_reserved and not ip.is_loopback):
        return "an unspecified, multicast or reserved address"
    if ip.is_loopback or ip.is_private or _is_shared(ip):
        if not entry.names_private:
            return (
                "a private or loopback address: only an entry naming one (or localhost) reaches it"
            )
        if entry.host == "localhost" and not ip.is_loopback:
            return "not a loopback address, which is all a `localhost` entry reaches"
        return None
    if not ip.is_global:
        return "not a global address"
    return None


def _is_shared(ip: IPAddress) -> bool:
    return isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED_SPACE


_SHARED_SPACE = ipaddress.ip_network("100.64.0.0/10")


async def resolve_checked(address: ServerAddress, entry: ServerAddress) -> IPAddress:
    """The address to connect to for ``address``: its host resolved (asyncio's getaddrinfo,
    or the literal itself), every address it gives checked against ``entry``; the first.
    Raises UnsafeAddress when one is refused or none is found."""
    literal = address.ip
    if literal is not None:
        found = [literal]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                address.host, address.port, type=socket.SOCK_STREAM
            )
        except OSError as error:
            raise UnsafeAddress(
                f"could not resolve {address.host!r} ({error.strerror or error})"
            ) from None
        found = list(
            dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos)
        )
    if not found:
        raise UnsafeAddress(f"{address.host!r} resolves to no address")
    for ip in found:
        if (reason := refusal(ip, entry)) is not None:
            raise UnsafeAddress(f"{address.host!r} resolves to {ip}, {reason}; refused")
    return found[0]
