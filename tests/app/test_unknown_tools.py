"""A call of a tool the request does not have, through the running app (Ray Serve) and the
openai SDK: the scripted model (``UNKNOWN-TOOL-TASK`` in tests/fixtures/engine_script.yaml)
calls ``repo_browser.search``, which no tool of the request is (it has one function, which the
client runs, and no tool the server runs). The server answers the call inside the response and
the model answers, so the client, streaming or not, gets only the reasoning and the final
message: no call it would have to answer. Every event is valid as the SDK's type. In this
process, every bound on such calls: tests/unit/serving/tools/test_loop.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.support import API_KEY, MODEL
from tests.support.helpers import WEATHER_TOOL
from tests.support.traffic import sse_events

TASK = "UNKNOWN-TOOL-TASK: where is the tool loop?"
ANSWER = "UNKNOWN-ANSWERED: there is no repo browser here."
# The first completion's reasoning, then the continuation's, then its answer.
OUTPUT = ["reasoning", "reasoning", "message"]
EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def test_streamed_the_client_gets_only_the_answer(app_url: str) -> None:
    body = {"model": MODEL, "input": TASK, "tools": [WEATHER_TOOL], "stream": True}
    answer = httpx.post(
        f"{app_url}/v1/responses",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    events = list(sse_events(answer.text))
    for event in events:
        EVENT.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == OUTPUT  # nothing announced for the call
    assert not [e for e in events if "function_call" in e["type"]]
    assert "repo_browser" not in json.dumps(events)
    final = TypeAdapter(Response).validate_python(events[-1]["response"])
    assert events[-1]["type"] == "response.completed" and final.status == "completed"
    assert [item.type for item in final.output] == OUTPUT
    assert final.output_text == ANSWER


def test_not_streamed_the_same_and_the_stored_response_chains(client: OpenAI) -> None:
    response = client.responses.create(model=MODEL, input=TASK, tools=[WEATHER_TOOL])
    assert response.status == "completed"
    assert [item.type for item in response.output] == OUTPUT
    assert response.output_text == ANSWER
    # Stored as sent; a follow-up chains on it (its history holds no call without an output).
    assert client.responses.retrieve(response.id).output == response.output
    follow_up = client.responses.create(
        model=MODEL, previous_response_id=response.id, input="SDK-TEXT: and now?"
    )
    assert follow_up.output_text == "Hello from the scripted engine."


def test_the_sdks_stream_helper_accumulates_only_the_answer(client: OpenAI) -> None:
    with client.responses.stream(model=MODEL, input=TASK, tools=[WEATHER_TOOL]) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert [item.type for item in final.output] == OUTPUT
    assert final.output_text == ANSWER
