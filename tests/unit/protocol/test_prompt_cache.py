"""``prompt_cache_options`` and ``prompt_cache_breakpoint`` as the openai SDK types them: what a
request may send (each bad value a 400 naming its param), what the Response echoes."""

from __future__ import annotations

import pytest
from openai.types.responses import Response
from pydantic import ValidationError

from serve_app.protocol.body_errors import from_validation_errors
from serve_app.protocol.prompt_cache import (
    PromptCacheOptions,
    applied,
    is_prewarm,
    written_breakpoints,
)
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import initial_response
from tests.support import MODEL

MARK = {"mode": "explicit"}


def message(*parts: dict, role: str = "user") -> dict:
    return {"type": "message", "role": role, "content": list(parts)}


def param_of(body: dict) -> str | None:
    with pytest.raises(ValidationError) as caught:
        ResponsesRequest.model_validate({"model": MODEL, **body})
    return from_validation_errors(list(caught.value.errors())).param


def marked(kind: str, mark: object, role: str = "user") -> dict:
    """A message whose second part (``kind``) carries ``mark`` as its breakpoint."""
    part = {"type": kind, "text": "b", "prompt_cache_breakpoint": mark}
    return {"input": [message({"type": "input_text", "text": "a"}, part, role=role)]}


OPTIONS = "prompt_cache_options"
ON_PART = "input[0].content[1].prompt_cache_breakpoint"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", OPTIONS: {"mode": "auto"}}, f"{OPTIONS}.mode"),
        ({"input": "x", OPTIONS: {"ttl": "24h"}}, f"{OPTIONS}.ttl"),
        ({"input": "x", OPTIONS: {"prewarm": "yes"}}, f"{OPTIONS}.prewarm"),
        ({"input": "x", OPTIONS: "explicit"}, OPTIONS),
        (
            {"input": "x", OPTIONS: {"comparison_response_id": ""}},
            f"{OPTIONS}.comparison_response_id",
        ),
        (marked("input_text", True), ON_PART),
        (marked("input_text", {"mode": "implicit"}), f"{ON_PART}.mode"),
        (marked("input_text", {"mode": "explicit", "ttl": "1h"}), f"{ON_PART}.ttl"),
        # The model's own part: not the client's to mark.
        (marked("output_text", MARK, role="assistant"), ON_PART),
    ],
)
def test_a_bad_value_is_a_400_naming_its_param(body: dict, param: str) -> None:
    assert param_of(body) == param


@pytest.mark.parametrize("kind", ["input_text", "input_image", "input_file"])
def test_every_input_part_the_sdk_marks_takes_a_breakpoint(kind: str) -> None:
    part = {"type": kind, "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}}
    if kind == "input_text":
        part["text"] = "a"
    request = ResponsesRequest.model_validate({"model": MODEL, "input": [message(part)]})
    [content] = request.input_items[0].content
    assert content.prompt_cache_breakpoint is not None
    assert content.prompt_cache_breakpoint.ttl == "12h"


def test_the_options_as_applied_take_the_defaults() -> None:
    assert applied(None) == PromptCacheOptions(mode="implicit", ttl="30m")
    given = PromptCacheOptions(mode="explicit", ttl="12h", prewarm=True, comparison_response_id="r")
    assert applied(given) == PromptCacheOptions(
        mode="explicit", ttl="12h", comparison_response_id="r"
    )
    assert is_prewarm(given) and not is_prewarm(None) and not is_prewarm(PromptCacheOptions())


def test_a_request_writes_the_latest_four_explicit_or_three_beside_the_implicit() -> None:
    positions = [10, 20, 30, 40, 50]
    assert written_breakpoints("explicit", positions) == (20, 30, 40, 50)
    assert written_breakpoints("implicit", positions) == (30, 40, 50)
    assert written_breakpoints(None, positions) == (30, 40, 50)
    assert written_breakpoints("explicit", []) == ()


def test_the_response_echoes_the_options_as_the_sdk_types_them() -> None:
    def echo(options: dict | None) -> dict | None:
        body = {"model": MODEL, "input": "x"}
        if options is not None:
            body["prompt_cache_options"] = options
        response = initial_response(
            ResponsesRequest.model_validate(body), response_id="resp_1", model=MODEL
        )
        # Through the SDK's own Response: the echo is its `PromptCacheOptions`.
        parsed = Response.model_validate(response.model_dump())
        return parsed.prompt_cache_options.model_dump() if parsed.prompt_cache_options else None

    assert echo(None) == {"mode": "implicit", "ttl": "30m", "comparison_response_id": None}
    assert echo({"mode": "explicit", "ttl": "12h", "prewarm": True}) == {
        "mode": "explicit",
        "ttl": "12h",
        "comparison_response_id": None,
    }
    assert echo({"comparison_response_id": "resp_0"})["comparison_response_id"] == "resp_0"


def test_prompt_cache_retention_is_independent_of_the_ttl() -> None:
    # The SDK: retention is a maximum, ttl a minimum; "the two fields ... do not interact".
    request = ResponsesRequest.model_validate(
        {"model": MODEL, "input": "x", "prompt_cache_retention": "24h"}
    )
    response = initial_response(request, response_id="resp_1", model=MODEL)
    assert response.prompt_cache_retention == "24h"
    assert response.prompt_cache_options.ttl == "30m"
