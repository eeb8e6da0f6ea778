"""``response.inject`` (the ``responses_multi_agent=v1`` beta) through the openai SDK's beta
WebSocket client (``client.beta.responses.connect``) against the running app (two ingress and
two engine replicas, or `tests.local_app`): the output injected into the waiting response
continues it in place, on the engine replica that holds its prompt (the continuation finds the
first completion's prompt cached), stored as one response; another connection's inject finds no
response. Every event is validated by the SDK's beta types, and its GA types where they have it.
The refusals, the wait's bound and the races: tests/unit/serving/test_inject.py."""

from __future__ import annotations

import json
from typing import Any

from openai import OpenAI
from openai.types.beta.beta_responses_server_event import BetaResponsesServerEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from tests.support import MODEL
from tests.support.websocket import TERMINAL

BETA = {"OpenAI-Beta": "responses_multi_agent=v1"}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "strict": False,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
BETA_EVENT: TypeAdapter[Any] = TypeAdapter(BetaResponsesServerEvent)
GA_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)


def events_until(connection: Any, done: Any) -> list[dict[str, Any]]:
    events = []
    while True:
        event = json.loads(connection.recv_bytes())
        BETA_EVENT.validate_python(event)
        if not event["type"].startswith("response.inject."):
            GA_EVENT.validate_python(event)
        events.append(event)
        if done(event):
            return events


def call_made(event: dict[str, Any]) -> bool:
    return event["type"] == "response.output_item.done" and event["item"]["type"] == "function_call"


def test_an_injected_output_resumes_the_response_on_its_replica(client: OpenAI) -> None:
    with (
        client.beta.responses.connect(extra_headers=BETA) as connection,
        client.beta.responses.connect(extra_headers=BETA) as other,
    ):
        connection.response.create(
            model=MODEL, input="SDK-TOOL: weather in Paris?", tools=[WEATHER_TOOL], store=True
        )
        before = events_until(connection, call_made)
        response_id, call_id = before[0]["response"]["id"], before[-1]["item"]["call_id"]
        sent = [{"type": "function_call_output", "call_id": call_id, "output": "INJECTED-OUTPUT"}]
        # Not this connection's response, on the other one.
        other.response.inject(response_id=response_id, input=sent)
        (failed,) = events_until(other, lambda event: True)
        assert failed["type"] == "response.inject.failed"
        assert failed["error"]["code"] == "response_not_found"
        connection.response.inject(response_id=response_id, input=sent)
        after = events_until(connection, lambda event: event["type"] in TERMINAL)
    events = before + after
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert after[0] == {
        "type": "response.inject.created",
        "response_id": response_id,
        "sequence_number": len(before),
    }
    done = after[-1]["response"]
    assert after[-1]["type"] == "response.completed" and done["id"] == response_id
    assert [item["type"] for item in done["output"]] == [
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
    ]
    # Two completions, the second's prompt the first's and more: found cached on the replica
    # that served the first (routed by the same session), it is at least half the input.
    usage = done["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= usage["input_tokens"] // 2 - 40
    stored = client.responses.retrieve(response_id)
    assert stored.model_dump(mode="json", exclude_unset=True)["output"] == done["output"]
