"""Service tiers through the whole API in this process, with the openai SDK (issue 49): the
tier a response was served at is in the Response, in every stream event's response and in the
stored one; the operator's policy decides what each API key may ask and what ``auto`` is; the
engine is asked with the tier's scheduling priority and deadline.

The running app's and the JS SDK's: tests/clients/test_openai_sdk_tiers.py,
tests/clients/test_js_tiers.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi import FastAPI
from openai.types.responses import Response, ResponseStreamEvent
from prometheus_client import REGISTRY
from pydantic import TypeAdapter

from serve_app.config import AppArgs, ServiceTierArgs, TierPolicy
from serve_app.engines.base import GenerateRequest
from serve_app.protocol.service_tiers import PRIORITY
from serve_app.serving.http.auth import ApiKeys, owner_digest
from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client

EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
CODEX_KEY, BATCH_KEY, OTHER_KEY = "sk-codex", "sk-batch", "sk-other"
TIERS = ServiceTierArgs(
    # Keys not named below: default and flex, auto as default.
    default=TierPolicy(allowed=["default", "flex"], auto="default"),
    keys={
        owner_digest(CODEX_KEY): TierPolicy(
            allowed=["priority", "default", "flex"], auto="priority"
        ),
        owner_digest(BATCH_KEY): TierPolicy(allowed=["flex"], auto="flex"),
    },
    deadline_s={"priority": 0.0, "default": 4.0, "flex": 30.0},
)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FastAPI]:
    keys = ApiKeys([CODEX_KEY, BATCH_KEY, OTHER_KEY])
    async with in_process_api(
        tmp_path / "t.db", AppArgs(service_tiers=TIERS), api_keys=keys
    ) as api:
        yield api


@pytest.fixture
def asked(api: FastAPI) -> Iterator[list[GenerateRequest]]:
    """The engine requests the app makes, in order."""
    engine = api.state.engine
    seen: list[GenerateRequest] = []
    generate = engine.generate

    def spy(request: GenerateRequest) -> Any:
        seen.append(request)
        return generate(request)

    engine.generate = spy
    yield seen
    engine.generate = generate


@pytest.mark.parametrize(
    ("key", "asked_tier", "served"),
    [
        (CODEX_KEY, None, "priority"),  # this key's auto
        (CODEX_KEY, "auto", "priority"),
        (CODEX_KEY, "fast", "priority"),
        (CODEX_KEY, "ultrafast", "priority"),
        (CODEX_KEY, "scale", "default"),
        (CODEX_KEY, "flex", "flex"),
        (BATCH_KEY, None, "flex"),
        (OTHER_KEY, None, "default"),
        (OTHER_KEY, "default", "default"),
        (OTHER_KEY, "flex", "flex"),
    ],
)
async def test_the_response_reports_the_tier_it_was_served_at(
    api: FastAPI, asked: list[GenerateRequest], key: str, asked_tier: str | None, served: str
) -> None:
    client = sdk_client(api, key)
    tier = {} if asked_tier is None else {"service_tier": asked_tier}
    response = await client.responses.create(model=MODEL, input="hi", **tier)
    assert response.service_tier == served
    Response.model_validate(response.model_dump())
    stored = await client.responses.retrieve(response.id)
    assert stored.service_tier == served
    (request,) = asked
    assert request.priority == PRIORITY[served]  # type: ignore[index]
    assert request.deadline_s == TIERS.deadline_s[served]  # type: ignore[index]


async def test_every_streamed_events_response_carries_the_tier(api: FastAPI) -> None:
    client = sdk_client(api, CODEX_KEY)
    stream = await client.responses.create(
        model=MODEL, input="hi", service_tier="flex", stream=True
    )
    events = [event async for event in stream]
    with_response = [event for event in events if hasattr(event, "response")]
    assert [event.type for event in with_response] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    for event in events:
        EVENTS.validate_python(event.model_dump())
    assert {event.response.service_tier for event in with_response} == {"flex"}


@pytest.mark.parametrize(
    ("key", "asked_tier"),
    [(OTHER_KEY, "priority"), (OTHER_KEY, "fast"), (OTHER_KEY, "ultrafast"), (BATCH_KEY, "auto")],
)
async def test_a_tier_the_key_may_not_use_is_a_400_naming_service_tier(
    api: FastAPI, asked: list[GenerateRequest], key: str, asked_tier: str
) -> None:
    client = sdk_client(api, key)
    if key == BATCH_KEY:  # its auto is flex, which it may use: ask default explicitly instead
        asked_tier = "default"
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=MODEL, input="hi", service_tier=asked_tier)  # type: ignore[arg-type]
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == "service_tier"
    assert "service_tier" in error["message"]
    assert asked == []  # refused before the engine was asked


async def test_an_open_api_is_served_by_the_default_policy(tmp_path: Path) -> None:
    args = AppArgs(service_tiers=TIERS)
    async with in_process_api(tmp_path / "open.db", args) as api:
        client = sdk_client(api)
        assert (await client.responses.create(model=MODEL, input="hi")).service_tier == "default"
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model=MODEL, input="hi", service_tier="priority")


async def test_without_tier_settings_every_tier_is_served_as_asked(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "plain.db") as api:
        client = sdk_client(api)
        for asked_tier, served in [("priority", "priority"), ("flex", "flex"), ("auto", "default")]:
            response = await client.responses.create(
                model=MODEL,
                input="hi",
                service_tier=asked_tier,  # type: ignore[arg-type]
            )
            assert response.service_tier == served


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_requests_and_time_to_first_token_are_counted_per_tier(api: FastAPI) -> None:
    before = {
        tier: (
            _sample("serve_app_tier_requests_total", tier=tier, status="completed"),
            _sample("serve_app_tier_time_to_first_token_seconds_count", tier=tier),
        )
        for tier in ("priority", "default", "flex")
    }
    client = sdk_client(api, CODEX_KEY)
    for tier in ("priority", "flex", "flex"):
        await client.responses.create(model=MODEL, input="hi", service_tier=tier)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        await sdk_client(api, BATCH_KEY).responses.create(
            model=MODEL, input="hi", service_tier="priority"
        )
    counted = {
        tier: (
            _sample("serve_app_tier_requests_total", tier=tier, status="completed") - requests,
            _sample("serve_app_tier_time_to_first_token_seconds_count", tier=tier) - ttfts,
        )
        for tier, (requests, ttfts) in before.items()
    }
    assert counted == {"priority": (1, 1), "default": (0, 0), "flex": (2, 2)}
    # The refusal is counted by the tier it asked to be served at, as rejected.
    assert _sample("serve_app_tier_requests_total", tier="priority", status="rejected") >= 1
