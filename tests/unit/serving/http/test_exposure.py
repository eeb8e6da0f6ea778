"""Closed by default: which apps may serve without API keys, and the ingress replica's start-up
refusing the others (its own `__init__`, with Ray's answers stood in for)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from serve_app.config import AppArgs, SecretArgs
from serve_app.serving import ingress
from serve_app.serving.http.exposure import (
    Exposure,
    OpenApiRefused,
    api_access,
    is_loopback,
)


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]", "localhost", "LOCALHOST", " ::1"],
)
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host",
    # Every interface, a routable address, a name (it may resolve anywhere), unset, empty.
    ["0.0.0.0", "::", "[::]", "10.0.0.5", "192.168.1.2", "fe80::1", "my-host", "", None],
)
def test_hosts_beyond_loopback(host: str | None) -> None:
    assert not is_loopback(host)


def test_keys_close_the_api_wherever_it_listens() -> None:
    for exposure in (Exposure("127.0.0.1", 1), Exposure("0.0.0.0", 1), Exposure(None, 5)):
        for allow in (False, True):
            assert api_access(True, exposure, allow) == "closed"


def test_loopback_on_one_node_is_open_without_keys(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert api_access(False, Exposure("127.0.0.1", 1), allow_open_api=False) == "open"
    assert "open" in caplog.text and "loopback" in caplog.text


@pytest.mark.parametrize(
    ("exposure", "why"),
    [
        (Exposure("0.0.0.0", 1), "'0.0.0.0' (http_options.host)"),
        (Exposure("10.1.2.3", 1), "'10.1.2.3'"),
        (Exposure(None, 1), "a host it could not learn"),
        (Exposure("127.0.0.1", 2), "the Ray cluster has 2 nodes"),
        (Exposure("::", 3), "the Ray cluster has 3 nodes"),
    ],
)
def test_an_app_reachable_beyond_loopback_refuses_to_start_without_keys(
    exposure: Exposure, why: str
) -> None:
    with pytest.raises(OpenApiRefused) as refused:
        api_access(False, exposure, allow_open_api=False)
    message = str(refused.value)
    assert why in message
    # It names what to set: the keys, or the explicit opt-out.
    for remedy in ("SERVE_APP_API_KEYS", "SERVE_APP_API_KEYS_FILE", "allow_open_api: true"):
        assert remedy in message


def test_the_operator_may_open_it_explicitly_and_it_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert api_access(False, Exposure("0.0.0.0", 2), allow_open_api=True) == "open"
    (record,) = [r for r in caplog.records if "allow_open_api" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "OPEN" in record.getMessage() and "2 nodes" in record.getMessage()


def test_allow_open_api_is_an_app_arg_off_by_default() -> None:
    assert AppArgs().allow_open_api is False
    assert AppArgs.model_validate({"allow_open_api": True}).allow_open_api is True


class _Refused(Exception):
    """What the stand-ins raise should start-up get past the decision."""


async def _start_ingress(
    monkeypatch: pytest.MonkeyPatch, args: AppArgs, host: str | None, nodes: int
) -> None:
    """The ingress replica's own ``__init__`` (the class Serve runs), with Ray's two answers
    (the host Serve listens on, the cluster's nodes) stood in for; past the decision, opening
    the store is made to raise `_Refused`, so a start that goes on is told apart."""

    async def host_of_serve() -> str | None:
        return host

    def store(*_: object, **__: object) -> None:
        raise _Refused

    monkeypatch.setattr(ingress, "serve_http_host", host_of_serve)
    monkeypatch.setattr(ingress, "alive_nodes", lambda: nodes)
    monkeypatch.setattr(ingress, "SqlResponseStore", store)
    # On a stand-in self: an instance of the class would run its async __del__ when collected.
    await ingress.ResponsesIngress.func_or_class.__init__(SimpleNamespace(), None, args)


@pytest.fixture
def no_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SERVE_APP_API_KEYS", "SERVE_APP_API_KEYS_FILE"):
        monkeypatch.delenv(name, raising=False)


async def test_the_ingress_replica_refuses_to_start_open_on_every_interface(
    monkeypatch: pytest.MonkeyPatch, no_key_env: None, tmp_path
) -> None:
    args = AppArgs.model_validate({"store": {"url": f"sqlite+aiosqlite:///{tmp_path}/r.db"}})
    with pytest.raises(OpenApiRefused, match=r"0\.0\.0\.0"):
        await _start_ingress(monkeypatch, args, "0.0.0.0", 1)
    # On loopback it goes on (to the store); with keys, or opened explicitly, too.
    with pytest.raises(_Refused):
        await _start_ingress(monkeypatch, args, "127.0.0.1", 1)
    monkeypatch.setenv("SERVE_APP_API_KEYS", "sk-a,sk-b")
    with pytest.raises(_Refused):
        await _start_ingress(monkeypatch, args, "0.0.0.0", 1)
    monkeypatch.delenv("SERVE_APP_API_KEYS")
    opened = args.model_copy(update={"allow_open_api": True})
    with pytest.raises(_Refused):
        await _start_ingress(monkeypatch, opened, "0.0.0.0", 1)
    keyed = args.model_copy(update={"secrets": SecretArgs(api_keys=["sk-config"])})
    with pytest.raises(_Refused):
        await _start_ingress(monkeypatch, keyed, "0.0.0.0", 1)


async def test_the_ingress_replica_refuses_to_start_open_across_nodes(
    monkeypatch: pytest.MonkeyPatch, no_key_env: None
) -> None:
    # PostgreSQL, as several nodes need (an SQLite store would be refused first).
    args = AppArgs.model_validate({"store": {"url": "postgresql+asyncpg://u:p@db/x"}})
    with pytest.raises(OpenApiRefused, match="2 nodes"):
        await _start_ingress(monkeypatch, args, "127.0.0.1", 2)
