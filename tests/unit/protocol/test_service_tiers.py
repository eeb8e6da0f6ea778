"""``service_tier`` (issue 49): every value the openai SDK types is accepted, and each is served
at one of the three tiers this deployment schedules by (`serve_app.protocol.service_tiers`)."""

from __future__ import annotations

from typing import get_args, get_type_hints

import pytest
from openai.types.responses import ServiceTier as SDKServiceTier
from openai.types.responses.response import Response
from openai.types.responses.response_create_params import ResponseCreateParamsBase

from serve_app.config import TierPolicy
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.service_tiers import (
    PRIORITY,
    SERVED_AS,
    SERVICE_TIERS,
    served_tier,
    tier_of,
)
from tests.support import MODEL


def _sdk_values(annotation: object) -> set[str]:
    """The string literals of an SDK annotation (``Optional[Literal[...]]``, nested)."""
    values: set[str] = set()
    stack = [annotation]
    while stack:
        node = stack.pop()
        args = get_args(node)
        if not args and isinstance(node, str):
            values.add(node)
        stack.extend(args)
    return values


SDK_REQUEST_TIERS = _sdk_values(get_type_hints(ResponseCreateParamsBase)["service_tier"])
SDK_RESPONSE_TIERS = _sdk_values(Response.model_fields["service_tier"].annotation)


def test_the_sdk_types_the_values_this_module_knows() -> None:
    """A value the SDK adds fails here, so it is mapped on purpose, never refused by surprise."""
    assert {
        "auto",
        "default",
        "flex",
        "scale",
        "priority",
        "fast",
        "ultrafast",
    } <= SDK_REQUEST_TIERS
    assert set(SERVICE_TIERS) == SDK_REQUEST_TIERS == _sdk_values(SDKServiceTier)
    assert set(SERVED_AS) == SDK_REQUEST_TIERS - {"auto"}


@pytest.mark.parametrize("value", sorted(SDK_REQUEST_TIERS))
def test_every_value_the_sdk_types_is_accepted(value: str) -> None:
    request = ResponsesRequest.model_validate({"model": MODEL, "service_tier": value})
    assert request.service_tier == value


def test_a_value_the_sdk_does_not_type_is_refused() -> None:
    with pytest.raises(ValueError, match="service_tier"):
        ResponsesRequest.model_validate({"model": MODEL, "service_tier": "fastest"})


def test_each_value_is_served_at_a_tier_the_response_may_report() -> None:
    # fast is priority at OpenAI ("The response will show service_tier=priority"); this
    # deployment has no faster path than its priority tier, so ultrafast is served there too,
    # and scale (reserved capacity units) as default, as OpenAI serves a project without them.
    assert SERVED_AS == {
        "default": "default",
        "flex": "flex",
        "scale": "default",
        "priority": "priority",
        "fast": "priority",
        "ultrafast": "priority",
    }
    assert set(SERVED_AS.values()) <= SDK_RESPONSE_TIERS


def test_auto_and_no_value_resolve_to_the_policys_auto_tier() -> None:
    policy = TierPolicy(allowed=["default", "flex"], auto="flex")
    assert served_tier(None, policy) == "flex"
    assert served_tier("auto", policy) == "flex"
    assert served_tier("fast", TierPolicy()) == "priority"
    assert served_tier("auto", TierPolicy()) == "default"


def test_priority_before_default_before_flex_lower_first_as_vllm_orders() -> None:
    assert PRIORITY["priority"] < PRIORITY["default"] < PRIORITY["flex"]
    assert PRIORITY["default"] == 0  # an engine request that names no tier is default's
    assert {tier_of(level) for level in PRIORITY.values()} == set(PRIORITY)
    assert tier_of(7) is None
