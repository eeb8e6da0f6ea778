"""The app's runtime settings live in `AppArgs`; each SERVE_APP_* variable overrides its field
where the setting is used (`resolved`), and only when set."""

from __future__ import annotations

import pytest

from serve_app.config import AppArgs


def test_unset_variables_leave_the_args_as_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "SERVE_APP_STREAM_WINDOW_S",
        "SERVE_APP_ENGINE_CHANNELS",
        "SERVE_APP_CHANNEL_IDLE_S",
        "SERVE_APP_ENGINE_HEARTBEAT_S",
        "SERVE_APP_ENGINE_SILENCE_S",
        "SERVE_APP_ENGINE_LIVE_SILENCE_S",
        "SERVE_APP_API_KEYS",
        "SERVE_APP_API_KEYS_FILE",
        "SERVE_APP_REASONING_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    args = AppArgs.model_validate(
        {
            "streaming": {"window_s": 0.05, "channels": False, "channel_idle_s": 5},
            "secrets": {"api_keys": ["a"], "api_keys_file": "/keys", "reasoning_key": "r"},
        }
    )
    assert args.streaming.resolved() == args.streaming
    assert args.secrets.resolved() == args.secrets
    assert AppArgs().streaming.resolved().model_dump() == {
        "window_s": 0.02,
        "channels": True,
        "channel_idle_s": 2.0,
        "heartbeat_s": 0.25,
        "silence_s": 1.5,
        "live_silence_s": 15.0,
    }


def test_each_variable_overrides_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_APP_STREAM_WINDOW_S", "0")
    monkeypatch.setenv("SERVE_APP_ENGINE_CHANNELS", "0")
    monkeypatch.setenv("SERVE_APP_CHANNEL_IDLE_S", "0.5")
    monkeypatch.setenv("SERVE_APP_ENGINE_HEARTBEAT_S", "0.1")
    monkeypatch.setenv("SERVE_APP_ENGINE_SILENCE_S", "3")
    monkeypatch.setenv("SERVE_APP_ENGINE_LIVE_SILENCE_S", "20")
    monkeypatch.setenv("SERVE_APP_API_KEYS", " k1, ,k2 ")
    monkeypatch.setenv("SERVE_APP_API_KEYS_FILE", "/run/keys")
    monkeypatch.setenv("SERVE_APP_REASONING_KEY", "secret")
    args = AppArgs.model_validate({"secrets": {"api_keys": ["config-key"]}})
    streaming, secrets = args.streaming.resolved(), args.secrets.resolved()
    assert (streaming.window_s, streaming.channels, streaming.channel_idle_s) == (0, False, 0.5)
    assert (streaming.heartbeat_s, streaming.silence_s, streaming.live_silence_s) == (0.1, 3, 20)
    assert secrets.api_keys == ["k1", "k2"]
    assert (secrets.api_keys_file, secrets.reasoning_key) == ("/run/keys", "secret")
    monkeypatch.setenv("SERVE_APP_ENGINE_CHANNELS", "1")
    assert AppArgs().streaming.resolved().channels is True


def test_mcp_allowlist_is_empty_by_default_and_the_variable_replaces_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SERVE_APP_MCP_ALLOW", raising=False)
    configured = AppArgs.model_validate({"tools": {"mcp_allow": ["https://mcp.example.com/"]}})
    assert AppArgs().tools.mcp_allow == []
    assert configured.tools.resolved() == configured.tools
    monkeypatch.setenv("SERVE_APP_MCP_ALLOW", " http://127.0.0.1:9000/mcp, ,https://b.example/x ")
    resolved = configured.tools.resolved()
    assert resolved.mcp_allow == ["http://127.0.0.1:9000/mcp", "https://b.example/x"]
    assert resolved.mcp_call_timeout_s == configured.tools.mcp_call_timeout_s
    monkeypatch.setenv("SERVE_APP_MCP_ALLOW", "")
    assert configured.tools.resolved().mcp_allow == []


@pytest.mark.parametrize(
    "entry", ["ftp://mcp.example.com/", "mcp.example.com", "https://user:pw@mcp.example.com/"]
)
def test_an_mcp_allowlist_entry_is_an_http_url_without_credentials(entry: str) -> None:
    with pytest.raises(ValueError, match=r"tools\.mcp_allow"):
        AppArgs.model_validate({"tools": {"mcp_allow": [entry]}})


def test_service_tiers_refuse_what_they_cannot_mean() -> None:
    """Issue 49: a key named by anything but its digest (a key pasted into a config is a
    leaked secret), an auto tier the key may not use, deadlines out of the tiers' order."""
    from pydantic import ValidationError

    from serve_app.config import ServiceTierArgs, TierPolicy

    with pytest.raises(ValidationError, match="not a key's digest"):
        ServiceTierArgs(keys={"sk-live-123": TierPolicy()})
    with pytest.raises(ValidationError, match="auto tier 'priority'"):
        TierPolicy(allowed=["default", "flex"], auto="priority")
    with pytest.raises(ValidationError, match="priority's <= default's <= flex's"):
        ServiceTierArgs(deadline_s={"priority": 0, "default": 90, "flex": 60})
    with pytest.raises(ValidationError, match="no deadline for"):
        ServiceTierArgs(deadline_s={"priority": 0, "default": 5})
    digest = "0123456789abcdef0123456789abcdef"
    tiers = ServiceTierArgs(keys={digest: TierPolicy(allowed=["flex"], auto="flex")})
    assert tiers.policy(digest).auto == "flex"
    assert tiers.policy("f" * 32) == tiers.policy(None) == TierPolicy()
