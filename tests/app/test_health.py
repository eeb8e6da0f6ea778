"""The running app's probes and keys: `/health` (liveness) says the API is closed, `/ready`
reaches the store and an engine replica (its health check through the engine handle), and the
session app's two keys are two tenants while anything else is a 401."""

from __future__ import annotations

import httpx
import pytest
from openai import AuthenticationError, NotFoundError, OpenAI

from serve_app.serving.http.exposure import serve_http_host
from tests.support import API_KEY, MODEL, OTHER_API_KEY


def test_health_and_readiness_need_no_key_and_say_the_api_is_closed(app_url: str) -> None:
    assert httpx.get(f"{app_url}/health", timeout=30).json() == {"status": "ok", "api": "closed"}
    ready = httpx.get(f"{app_url}/ready", timeout=30)
    assert ready.status_code == 200, ready.text
    assert ready.json() == {"status": "ready", "api": "closed"}


def test_the_two_keys_are_two_tenants_and_other_keys_are_refused(app_url: str) -> None:
    def client(key: str) -> OpenAI:
        return OpenAI(base_url=f"{app_url}/v1", api_key=key, max_retries=0, timeout=60)

    created = client(API_KEY).responses.create(model=MODEL, input="SDK-TEXT")
    assert client(API_KEY).responses.retrieve(created.id).id == created.id
    with pytest.raises(NotFoundError):
        client(OTHER_API_KEY).responses.retrieve(created.id)
    with pytest.raises(AuthenticationError):
        client("sk-wrong").responses.retrieve(created.id)
    assert httpx.get(f"{app_url}/v1/models", timeout=30).status_code == 401


async def test_the_ingress_learns_the_host_serve_listens_on(app_cluster: None) -> None:
    """What an ingress replica asks as it starts (Serve's controller, as Ray 2.60's own replicas
    ask it), against the real Serve: the session app listens on loopback."""
    assert await serve_http_host() == "127.0.0.1"
