"""Spec-complete Response objects, reasoning summaries and max_tool_calls against the running app
(the real one on Ray in CI, or ``python -m tests.local_app``), through the openai SDK and the
wire, with the scripted turns marked ``SUM-`` in tests/fixtures/engine_script.yaml. Every
Response and event read here is also checked against the Open Responses specification when it is
on this machine (tests/support/open_responses.py). What needs other app args:
tests/unit/serving/turn/test_service.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests.support import MODEL, open_responses
from tests.support.helpers import EXEC_TOOL
from tests.support.open_responses import check_spec

SUMMARY_TEXT = "First I think about the question, then I answer it briefly."


def http(app_url: str) -> httpx.Client:
    return httpx.Client(base_url=app_url, headers={"authorization": "Bearer sk-test"}, timeout=60)


def sse(app_url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed response, as JSON from the wire."""
    with (
        http(app_url) as session,
        session.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply,
    ):
        assert reply.status_code == 200, reply.read()
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    return [json.loads(line.removeprefix("data: ")) for line in lines]


def check_fields(response: dict[str, Any]) -> None:
    """Every field of OpenAI's Response, with OpenAI's default where the request set none."""
    assert set(response) == open_responses.RESPONSE_FIELDS
    for key, default in open_responses.OPENAI_DEFAULTS.items():
        if key not in ("store", "completed_at", "reasoning"):
            assert response[key] == default, key
    check_spec(response)


def test_every_response_field_is_there_in_every_form(app_url: str) -> None:
    body = {"model": MODEL, "input": "SUM-TEXT please"}
    with http(app_url) as session:
        created = session.post("/v1/responses", json=body)
        assert created.status_code == 200, created.text
        plain = created.json()
        retrieved = session.get(f"/v1/responses/{plain['id']}").json()
    events = sse(app_url, body)
    first, last = events[0], events[-1]
    assert (first["type"], last["type"]) == ("response.created", "response.completed")
    for response in (plain, retrieved, first["response"], last["response"]):
        check_fields(response)
    check_spec(events=events)
    # completed_at: null until completed, then set.
    assert first["response"]["completed_at"] is None
    assert isinstance(last["response"]["completed_at"], int)
    assert plain["completed_at"] == retrieved["completed_at"] and plain["completed_at"]
    assert plain["reasoning"] == {"effort": "medium", "summary": None}


def test_reasoning_items_carry_encrypted_content_only_when_sealed(app_url: str) -> None:
    body = {"model": MODEL, "input": "SUM-REASON now", "store": False}
    with http(app_url) as session:
        plain = session.post("/v1/responses", json=body).json()
        sealed = session.post(
            "/v1/responses", json={**body, "include": ["reasoning.encrypted_content"]}
        ).json()
    assert plain["output"][0]["type"] == "reasoning"
    assert "encrypted_content" not in plain["output"][0]
    assert isinstance(sealed["output"][0]["encrypted_content"], str)
    check_spec(plain)
    check_spec(sealed)


def test_a_summary_asked_for_holds_the_chain_of_thought(client: OpenAI) -> None:
    types: list[str] = []
    with client.responses.stream(
        model=MODEL, input="SUM-REASON now", reasoning={"effort": "low", "summary": "auto"}
    ) as stream:
        for event in stream:
            types.append(event.type)
            if not hasattr(event, "response"):  # (those carry the SDK's parsed snapshot)
                check_spec(events=[event.to_dict()])
        final = stream.get_final_response()
    reasoning = final.output[0]
    assert reasoning.type == "reasoning"
    assert [(part.type, part.text) for part in reasoning.summary] == [
        ("summary_text", SUMMARY_TEXT)
    ]
    assert reasoning.content is not None and reasoning.content[0].text == SUMMARY_TEXT
    assert final.reasoning is not None and final.reasoning.summary == "auto"
    summary_events = [t for t in types if "reasoning_summary" in t]
    assert summary_events[0] == "response.reasoning_summary_part.added"
    assert summary_events[-2:] == [
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ]
    assert "response.reasoning_summary_text.delta" in summary_events


def test_without_a_summary_there_are_no_summary_events(app_url: str) -> None:
    events = sse(app_url, {"model": MODEL, "input": "SUM-REASON now"})
    assert not [e for e in events if "reasoning_summary" in e["type"]]
    assert events[-1]["response"]["output"][0]["summary"] == []


@pytest.mark.parametrize("limit", [1, 2, None])
def test_max_tool_calls_bounds_the_calls_of_a_response(client: OpenAI, limit: int | None) -> None:
    extra = {} if limit is None else {"max_tool_calls": limit}
    response = client.responses.create(
        model=MODEL, input="SUM-CALLS go", tools=[EXEC_TOOL], **extra
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == (3 if limit is None else limit)
    commands = [json.loads(call.arguments)["cmd"] for call in calls]
    assert commands == ["ls", "pwd", "id"][: len(calls)]
    assert response.status == "completed" and response.max_tool_calls == limit
    # Past the limit nothing follows the last call, not even the text the model went on to.
    assert (response.output_text == "") is (limit is not None)
    check_spec(response.to_dict())


def test_max_tool_calls_below_one_is_a_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="SUM-TEXT", max_tool_calls=0)
    assert caught.value.body["param"] == "max_tool_calls"  # type: ignore[index]
