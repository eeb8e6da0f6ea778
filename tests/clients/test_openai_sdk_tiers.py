"""``service_tier`` through the openai SDK against the running app (issue 49): every value the
SDK types (``openai.types.responses.ServiceTier``) is accepted, and the tier the response was
served at is in the Response, in every stream event's response and in the stored one, each
validated by the SDK's own types. The session app allows every tier to every key, ``auto`` as
default (configs/local.yaml). Per-key policies, the 400 and the engine's priority: in-process,
tests/unit/serving/turn/test_service_tiers.py; the JS SDK's: tests/clients/test_js_tiers.py."""

from __future__ import annotations

from typing import get_args

import pytest
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent, ServiceTier
from pydantic import TypeAdapter

from tests.support import MODEL

EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
# What each value the SDK types is served at (serve_app/protocol/service_tiers.py).
SERVED = {
    "auto": "default",
    "default": "default",
    "flex": "flex",
    "scale": "default",
    "priority": "priority",
    "fast": "priority",
    "ultrafast": "priority",
}
SDK_TIERS = sorted(value for arg in get_args(ServiceTier) for value in get_args(arg))


def test_the_table_names_every_value_the_sdk_types() -> None:
    assert set(SDK_TIERS) == set(SERVED)


@pytest.mark.parametrize("tier", SDK_TIERS)
def test_every_tier_is_served_and_reported_through_the_sdk(client: OpenAI, tier: str) -> None:
    created = client.responses.with_raw_response.create(
        model=MODEL,
        input="SDK-TEXT: say hello",
        service_tier=tier,  # type: ignore[arg-type]
    )
    body = created.http_response.json()
    assert body["service_tier"] == SERVED[tier]
    Response.model_validate(body)
    response = created.parse()
    assert response.service_tier == SERVED[tier]
    assert client.responses.retrieve(response.id).service_tier == SERVED[tier]

    events = list(
        client.responses.create(
            model=MODEL,
            input="SDK-TEXT: say hello",
            service_tier=tier,  # type: ignore[arg-type]
            stream=True,
        )
    )
    for event in events:
        EVENTS.validate_python(event.model_dump())
    tiers = [event.response.service_tier for event in events if hasattr(event, "response")]
    assert len(tiers) == 3 and set(tiers) == {SERVED[tier]}  # created, in_progress, completed
    assert events[-1].type == "response.completed"


def test_no_tier_is_auto_which_this_deployment_serves_as_default(client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="SDK-TEXT: say hello")
    assert response.service_tier == "default"


def test_a_value_the_sdk_does_not_type_is_a_400_naming_service_tier(client: OpenAI) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=MODEL,
            input="hi",
            service_tier="fastest",  # type: ignore[arg-type]
        )
    assert refused.value.body["param"] == "service_tier"  # type: ignore[index]
