"""``response.inject`` (the ``responses_multi_agent=v1`` beta) through the openai JS SDK's beta
WebSocket client (tests/js/inject_scenarios.mjs): the output injected into the waiting
response continues it in place, a second inject after its end is refused, and without the
beta header the inject is an error naming it. Every message the server sent, as the JS client
received it, is validated here by the openai Python SDK's beta types (and GA types, for the
events they have)."""

from __future__ import annotations

from typing import Any

from openai.types.beta.beta_responses_server_event import BetaResponsesServerEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from tests.support import js_scenarios

SCRIPT = "inject_scenarios.mjs"
BETA_EVENT: TypeAdapter[Any] = TypeAdapter(BetaResponsesServerEvent)
GA_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)


def validated(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for message in messages:
        BETA_EVENT.validate_python(message)
        if not message["type"].startswith("response.inject."):
            GA_EVENT.validate_python(message)
    return messages


def test_js_inject_resumes_the_response_in_place(app_url: str) -> None:
    messages = validated(js_scenarios.run(SCRIPT, "inject", app_url)["result"]["messages"])
    kinds = [message["type"] for message in messages]
    assert kinds.count("response.created") == 1
    terminal = next(m for m in messages if m["type"] == "response.completed")
    response = terminal["response"]
    assert [item["type"] for item in response["output"]] == [
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
    ]
    assert response["output"][-1]["content"][0]["text"] == "Read the injected output."
    # One stream: the inject's event numbered in it, up to the terminal event.
    stream = messages[: messages.index(terminal) + 1]
    assert [m["sequence_number"] for m in stream] == list(range(len(stream)))
    created = next(m for m in messages if m["type"] == "response.inject.created")
    assert created["response_id"] == response["id"]
    failed = messages[-1]
    assert failed["type"] == "response.inject.failed"
    assert failed["error"]["code"] == "response_already_completed"
    assert failed["sequence_number"] == terminal["sequence_number"] + 1


def test_js_inject_without_the_beta_is_an_error_naming_it(app_url: str) -> None:
    messages = validated(js_scenarios.run(SCRIPT, "no-beta", app_url)["result"]["messages"])
    terminal = next(m for m in messages if m["type"] == "response.completed")
    assert [item["type"] for item in terminal["response"]["output"]] == [
        "reasoning",
        "function_call",
    ]
    error = messages[-1]
    assert error["type"] == "error" and error["status"] == 400
    assert "OpenAI-Beta: responses_multi_agent=v1" in error["error"]["message"]
