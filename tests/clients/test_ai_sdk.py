"""The Vercel AI SDK 7 (`ai` + `@ai-sdk/openai` 4, from npm) against the app.

tests/js/ai_sdk_scenarios.mjs runs one scenario with `openai.responses("gpt-oss-120b")` and
prints what the SDK returned and every request body it sent. The scripted engine plays the
model (the turns marked AISDK- in tests/fixtures/engine_script.yaml).

At its default `store: true` the SDK sends the reasoning and message items of earlier responses
back as `{"type": "item_reference", "id": ...}`, in every tool step and every chat turn, and it
shows reasoning only from `summary` parts. gpt-oss is not a model the SDK knows to reason: it
sends `reasoning.summary` only with `forceReasoning: true` beside `reasoningSummary`.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support import js_scenarios

SCRIPT = "ai_sdk_scenarios.mjs"
TIMEOUT_S = 120

CHAIN_OF_THOUGHT = "17 has no divisor between 2 and 4, so it is prime."


def run_scenario(app_url: str, scenario: str) -> dict[str, Any]:
    return js_scenarios.run(SCRIPT, scenario, app_url, timeout_s=TIMEOUT_S)


def input_shape(request: dict[str, Any]) -> list[str]:
    """The request's input items as their types, with a reference shown as `ref:<id prefix>`."""
    shape = []
    for item in request["body"]["input"]:
        if item.get("type") == "item_reference":
            shape.append(f"ref:{item['id'].split('_', 1)[0]}")
        else:
            shape.append(item.get("type") or item["role"])
    return shape


def input_tokens_inlined(app_url: str, request: dict[str, Any], response_ids: list[str]) -> int:
    """The prompt size of ``request`` sent again with each item reference replaced by the item
    it names (from the earlier responses' output) and nothing stored: what the references must
    resolve to."""
    headers = {"Authorization": "Bearer sk-test"}
    items = {}
    for response_id in response_ids:
        response = httpx.get(f"{app_url}/v1/responses/{response_id}", headers=headers, timeout=30)
        response.raise_for_status()
        items.update({item["id"]: item for item in response.json()["output"]})
    body = request["body"]
    inlined = [
        items[item["id"]] if item.get("type") == "item_reference" else item
        for item in body["input"]
    ]
    response = httpx.post(
        f"{app_url}/v1/responses",
        json={**body, "input": inlined, "store": False, "stream": False},
        headers=headers,
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response.json()["usage"]["input_tokens"]


def assert_all_stored(requests: list[dict[str, Any]]) -> None:
    """Every request went to POST /v1/responses at the default `store: true` and succeeded."""
    for request in requests:
        assert (request["method"], request["path"]) == ("POST", "/v1/responses")
        assert request["body"].get("store", True) is True
        assert request["status"] == 200, request.get("error")


@pytest.mark.parametrize("scenario", ["tool-loop", "tool-loop-stream"])
def test_tool_loop_over_three_steps_with_item_references(app_url: str, scenario: str) -> None:
    output = run_scenario(app_url, scenario)
    result = output["result"]
    steps = result["steps"]
    assert len(steps) == 3
    assert result["toolCalls"] == [{"city": "Lyon"}, {"city": "Marseille"}]  # executed
    assert [step["finishReason"] for step in steps] == ["tool-calls", "tool-calls", "stop"]
    assert [call["input"] for step in steps for call in step["toolCalls"]] == [
        {"city": "Lyon"},
        {"city": "Marseille"},
    ]
    assert [result["output"] for step in steps for result in step["toolResults"]] == [
        "AISDK-POPULATION LYON: 522000",
        "AISDK-POPULATION MARSEILLE: 873000",
    ]
    expected = "Marseille is larger: 873000 people against 522000 in Lyon."
    assert result["text"] == steps[2]["text"] == expected
    assert len({step["responseId"] for step in steps}) == 3

    requests = output["requests"]
    assert_all_stored(requests)
    # Steps 2 and 3 send each earlier step's reasoning back by reference (function calls go
    # whole: the SDK references only provider-executed ones), and the app resolves them.
    assert [input_shape(request) for request in requests] == [
        ["user"],
        ["user", "ref:rs", "function_call", "function_call_output"],
        [
            *["user", "ref:rs", "function_call", "function_call_output"],
            *["ref:rs", "function_call", "function_call_output"],
        ],
    ]
    # The references were resolved to the items they name, not dropped: the prompt is as long as
    # with those items sent whole.
    response_ids = [step["responseId"] for step in steps]
    for step, request in zip(steps[1:], requests[1:], strict=True):
        assert step["inputTokens"] == input_tokens_inlined(app_url, request, response_ids)
    if scenario == "tool-loop-stream":
        assert all(request["body"].get("stream") is True for request in requests)
        assert {"tool-input-delta", "tool-call", "tool-result", "text-delta"} <= set(
            result["partTypes"]
        )


def test_two_turn_chat_from_response_messages(app_url: str) -> None:
    output = run_scenario(app_url, "chat")
    assert output["result"]["texts"] == ["Nice to meet you, Ada.", "Your name is Ada."]
    requests = output["requests"]
    assert_all_stored(requests)
    # Turn 2 sends turn 1's reasoning and message by reference, between the two user messages.
    assert [input_shape(request) for request in requests] == [
        ["user"],
        ["user", "ref:rs", "ref:msg", "user"],
    ]
    result = output["result"]
    inlined = input_tokens_inlined(app_url, requests[1], result["responseIds"][:1])
    assert result["inputTokens"][1] == inlined


@pytest.mark.parametrize("scenario", ["reasoning-summary", "reasoning-summary-stream"])
def test_reasoning_text_from_the_summary(app_url: str, scenario: str) -> None:
    output = run_scenario(app_url, scenario)
    result = output["result"]
    (request,) = output["requests"]
    assert request["body"]["reasoning"] == {"summary": "auto"}
    assert result["warnings"] == []
    assert result["text"] == "Yes, 17 is prime."
    # The summary holds the chain of thought as the model wrote it.
    assert result["reasoningText"] == CHAIN_OF_THOUGHT
    if scenario == "reasoning-summary-stream":
        assert "reasoning-delta" in result["partTypes"]
        assert result["reasoningDeltas"] == CHAIN_OF_THOUGHT
