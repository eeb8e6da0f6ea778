"""What the server may reach: the allowlist check a request's `server_url` passes before any
connection (a 400 naming the param), and the addresses a name may resolve to (DNS rebinding)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from serve_app.protocol.errors import InvalidRequest
from serve_app.serving.tools.mcp.policy import (
    UnsafeAddress,
    check_server_url,
    operator_entry,
    parse_server_url,
    refusal,
    resolve_checked,
)

ALLOW = ["https://a.example.com/mcp", "http://127.0.0.1:9000", "http://localhost:9100/"]


@pytest.mark.parametrize(
    "url",
    [
        "https://a.example.com/mcp",
        "https://a.example.com/mcp/",
        "https://a.example.com/mcp/v1/stream",
        "https://A.Example.COM./mcp",  # case and a trailing dot name the same host
        "https://a.example.com:443/mcp",  # the default port, spelled
        "https://a.example.com/mcp?key=1",
        "http://127.0.0.1:9000/anything",
        "http://localhost:9100/sse",
    ],
)
def test_urls_under_an_entry_pass(url: str) -> None:
    check_server_url(url, "tools[0].server_url", ALLOW)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://a.example.com.evil/mcp", "under no"),  # host boundary
        ("https://a.example.com.evil.net/mcp", "under no"),
        ("https://evil.a.example.com/mcp", "under no"),  # no subdomains
        ("https://a.example.com/mcpx", "under no"),  # path boundary
        ("https://a.example.com/", "under no"),
        ("http://a.example.com/mcp", "under no"),  # scheme
        ("https://a.example.com:8443/mcp", "under no"),  # port
        ("http://127.0.0.1:9001/", "under no"),
        ("http://127.0.0.2:9000/", "under no"),
        ("https://user:pw@a.example.com/mcp", "credentials"),
        ("https://token@a.example.com/mcp", "credentials"),
        ("ftp://a.example.com/mcp", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("a.example.com/mcp", "http or https"),
        ("https://a.example.com/mcp/../admin", "dot segments"),
        ("https://a.example.com/mcp/%2e%2e/admin", "dot segments"),
        ("https://a.example.com/mcp%2fadmin", "escaped separators"),
        ("https://a.example.com:99999/mcp", "not a valid URL"),
    ],
)
def test_other_urls_are_a_400_naming_the_param(url: str, why: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_server_url(url, "tools[2].server_url", ALLOW)
    assert caught.value.status_code == 400
    assert caught.value.param == "tools[2].server_url"
    assert "tools[2].server_url" in caught.value.message and why in caught.value.message


def test_with_no_entry_nothing_passes_and_the_message_says_why() -> None:
    with pytest.raises(InvalidRequest, match="allows none"):
        check_server_url("https://a.example.com/mcp", "tools[0].server_url", [])


def test_an_entry_with_a_trailing_slash_covers_its_path_and_below() -> None:
    allow = ["https://a.example.com/api/"]
    check_server_url("https://a.example.com/api", "p", allow)
    check_server_url("https://a.example.com/api/mcp", "p", allow)
    with pytest.raises(InvalidRequest):
        check_server_url("https://a.example.com/apix", "p", allow)


def _ip(text: str) -> Any:
    return ipaddress.ip_address(text)


PUBLIC = parse_server_url("https://a.example.com/mcp")
LOCALHOST = parse_server_url("http://localhost:9100/")
LOOPBACK_LITERAL = parse_server_url("http://127.0.0.1:9000/")
PRIVATE_LITERAL = parse_server_url("http://10.0.0.5:9000/")


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",  # the clouds' metadata service
        "169.254.1.1",
        "fe80::1",
        "fd00:ec2::254",  # AWS's IPv6 metadata
        "100.100.100.200",  # Alibaba's metadata
        "168.63.129.16",  # Azure's wire server
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "ff02::1",
        "240.0.0.1",
        "::ffff:169.254.169.254",  # v4-mapped
    ],
)
def test_link_local_metadata_and_odd_addresses_are_never_reached(address: str) -> None:
    for entry in (PUBLIC, LOCALHOST, LOOPBACK_LITERAL, PRIVATE_LITERAL):
        assert refusal(_ip(address), entry) is not None


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "::1", "10.1.2.3", "192.168.0.7", "172.16.0.1", "fd12::1", "100.64.0.1"],
)
def test_private_and_loopback_addresses_only_through_an_entry_naming_one(address: str) -> None:
    assert refusal(_ip(address), PUBLIC) is not None
    assert refusal(_ip(address), PRIVATE_LITERAL) is None
    assert refusal(_ip(address), LOOPBACK_LITERAL) is None


def test_a_localhost_entry_reaches_loopback_only() -> None:
    assert refusal(_ip("127.0.0.1"), LOCALHOST) is None
    assert refusal(_ip("::1"), LOCALHOST) is None
    assert refusal(_ip("10.0.0.1"), LOCALHOST) is not None


def test_global_addresses_pass_a_public_entry() -> None:
    assert refusal(_ip("93.184.216.34"), PUBLIC) is None
    assert refusal(_ip("2606:2800:220:1::1"), PUBLIC) is None
    assert refusal(_ip("192.0.2.1"), PUBLIC) is not None  # documentation range, not global


def _resolver(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> list[str]:
    asked: list[str] = []

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        asked.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (
                socket.AF_INET6 if ":" in ip else socket.AF_INET,
                socket.SOCK_STREAM,
                6,
                "",
                (ip, port),
            )
            for ip in answers[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


async def test_an_allowed_name_resolving_to_metadata_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _resolver(monkeypatch, {"a.example.com": ["169.254.169.254"]})
    address = parse_server_url("https://a.example.com/mcp")
    entry = check_server_url("https://a.example.com/mcp", "p", ALLOW)
    with pytest.raises(UnsafeAddress, match=r"169\.254\.169\.254"):
        await resolve_checked(address, entry)


async def test_one_refused_address_among_good_ones_refuses_the_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _resolver(monkeypatch, {"a.example.com": ["93.184.216.34", "10.0.0.8"]})
    address = parse_server_url("https://a.example.com/mcp")
    with pytest.raises(UnsafeAddress, match=r"10\.0\.0\.8"):
        await resolve_checked(address, address)


async def test_a_public_name_gives_its_first_address(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _resolver(monkeypatch, {"a.example.com": ["93.184.216.34", "93.184.216.35"]})
    address = parse_server_url("https://a.example.com/mcp")
    assert await resolve_checked(address, address) == _ip("93.184.216.34")
    assert asked == ["a.example.com"]


async def test_an_unknown_name_is_refused_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _resolver(monkeypatch, {})
    address = parse_server_url("https://nowhere.example/mcp")
    with pytest.raises(UnsafeAddress, match="could not resolve"):
        await resolve_checked(address, address)


async def test_a_literal_is_not_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _resolver(monkeypatch, {})
    assert await resolve_checked(LOOPBACK_LITERAL, LOOPBACK_LITERAL) == _ip("127.0.0.1")
    assert asked == []


@pytest.mark.parametrize("address", ["10.96.0.12", "172.20.0.4", "192.168.1.9", "127.0.0.1"])
async def test_an_operator_entry_reaches_the_private_address_its_name_resolves_to(
    monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    """The operator's own tool server (a cluster Service, a sidecar) is reached at the name
    the operator wrote; the same name as a request's allowlist entry is not."""
    _resolver(monkeypatch, {"serve-app-browser": [address]})
    url = "http://serve-app-browser:8101/mcp"
    assert await resolve_checked(parse_server_url(url), operator_entry(url)) == _ip(address)
    with pytest.raises(UnsafeAddress, match="private or loopback"):
        await resolve_checked(parse_server_url(url), parse_server_url(url))


@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "0.0.0.0"])
async def test_an_operator_entry_never_reaches_metadata_or_link_local(
    monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    _resolver(monkeypatch, {"serve-app-browser": [address]})
    url = "http://serve-app-browser:8101/mcp"
    with pytest.raises(UnsafeAddress):
        await resolve_checked(parse_server_url(url), operator_entry(url))
