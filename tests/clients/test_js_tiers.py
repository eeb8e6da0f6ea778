"""The openai JS SDK and service tiers (tests/js/tiers_scenarios.mjs, issue 49): every value the
JS SDK's own ``ServiceTier`` type names is sent through it, and what it got back (each created
and retrieved Response, every stream event) is held to the Python SDK's types here, the tier
served checked in each; a tier the key may not use is the JS SDK's ``BadRequestError`` naming
``service_tier``.

The app is the ingress's own FastAPI app in this process on uvicorn (no Ray: the session app
allows every tier to every key, and this needs a policy per key), with two keys: one whose
``auto`` is priority, one allowed flex only."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from serve_app.config import AppArgs, ServiceTierArgs, TierPolicy
from serve_app.serving.http.auth import ApiKeys, owner_digest
from tests.support import js_scenarios
from tests.support.helpers import JS_DIR, in_process_api, on_uvicorn

EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
CODEX_KEY, BATCH_KEY = "sk-js-codex", "sk-js-batch"
TIERS = ServiceTierArgs(
    default=TierPolicy(allowed=["default", "flex"]),
    keys={
        owner_digest(CODEX_KEY): TierPolicy(
            allowed=["priority", "default", "flex"], auto="priority"
        ),
        owner_digest(BATCH_KEY): TierPolicy(allowed=["flex"], auto="flex"),
    },
)
# What each value is served at for the Codex key (its auto is priority).
SERVED = {
    "auto": "priority",
    "default": "default",
    "flex": "flex",
    "scale": "default",
    "priority": "priority",
    "fast": "priority",
    "ultrafast": "priority",
}
RESPONSES_TYPES = JS_DIR / "node_modules" / "openai" / "resources" / "responses" / "responses.d.ts"


def js_sdk_tiers() -> list[str]:
    """The string values of the JS SDK's ``ServiceTier`` type, as its declarations spell it."""
    if not RESPONSES_TYPES.is_file():
        pytest.skip("tests/js/node_modules is missing: run `npm ci --prefix tests/js`")
    found = re.search(r"^export type ServiceTier = (.+);$", RESPONSES_TYPES.read_text(), re.M)
    assert found, "the JS SDK declares no ServiceTier type"
    return re.findall(r"'([a-z]+)'", found[1])


@pytest.fixture
async def app_url(tmp_path: Path) -> AsyncIterator[str]:
    keys = ApiKeys([CODEX_KEY, BATCH_KEY])
    args = AppArgs(service_tiers=TIERS)
    async with (
        in_process_api(tmp_path / "tiers.db", args, api_keys=keys) as api,
        on_uvicorn(api) as url,
    ):
        yield url


async def _run(app_url: str, scenario: str, key: str, tiers: list[str]) -> dict[str, Any]:
    env = {"SERVE_APP_KEY": key, "SERVE_APP_TIERS": json.dumps(tiers)}
    # The scenario blocks on node: the app it talks to runs on this event loop.
    script = "tiers_scenarios.mjs"
    return await asyncio.to_thread(js_scenarios.run, script, scenario, app_url, **env)


async def test_the_js_sdk_sends_every_tier_it_types_and_reads_the_tier_served(
    app_url: str,
) -> None:
    tiers = js_sdk_tiers()
    assert {"auto", "default", "flex", "scale", "priority", "fast", "ultrafast"} <= set(tiers)
    assert set(tiers) == set(SERVED), "a value the JS SDK types is not mapped here"
    output = await _run(app_url, "tiers", CODEX_KEY, tiers)
    sent = [request["body"]["service_tier"] for request in output["requests"] if "body" in request]
    assert sorted(set(sent)) == sorted(tiers)
    for tier, served in output["result"].items():
        for response in (served["created"], served["retrieved"]):
            assert Response.model_validate(response).service_tier == SERVED[tier], tier
        for event in served["events"]:
            EVENTS.validate_python(event)
        with_response = [event["response"] for event in served["events"] if "response" in event]
        assert [response["status"] for response in with_response] == [
            "in_progress",
            "in_progress",
            "completed",
        ]
        assert {response["service_tier"] for response in with_response} == {SERVED[tier]}


async def test_the_js_sdk_gets_a_400_naming_service_tier_for_a_tier_its_key_may_not_use(
    app_url: str,
) -> None:
    output = await _run(app_url, "refused", BATCH_KEY, ["priority"])
    refused = output["result"]
    assert refused["status"] == 400
    assert refused["param"] == "service_tier"
    assert "service_tier" in refused["message"]
    assert [request["status"] for request in output["requests"]] == [400]
