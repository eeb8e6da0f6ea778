"""Compaction: POST /v1/responses/compact with the openai SDK, and the compaction item sent back
in a later input renders as the summary in place of the history it replaced."""

from __future__ import annotations

import httpx
import pytest
from openai import BadRequestError, OpenAI

from tests.support import AUTH, MODEL, open_responses
from tests.support.weather_history import HISTORY, TOOLS


def test_compact_round_trip(client: OpenAI) -> None:
    compacted = client.responses.compact(model=MODEL, input=HISTORY, extra_body={"tools": TOOLS})
    assert compacted.object == "response.compaction"
    assert compacted.usage.input_tokens > 500 and compacted.usage.output_tokens > 0
    kinds = [item.type for item in compacted.output]
    assert kinds == ["message", "compaction"]  # the user's messages, then one compaction item
    assert compacted.output[0].content[0].text == HISTORY[0]["content"]
    sealed = compacted.output[-1].encrypted_content
    assert "COMPACTED-SUMMARY-7" not in sealed and "Paris" not in sealed  # opaque to clients

    # warnings=False: the SDK parses the kept user messages as (assistant) output messages.
    items = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    # The summary is the newest message: the scripted engine answers only when it sees it.
    resumed = client.responses.create(model=MODEL, input=items, tools=TOOLS)
    assert resumed.output_text == "Resuming from the summary: Paris is sunny."
    follow_up = [*items, {"role": "user", "content": "and tomorrow?"}]
    compacted_tokens = client.responses.input_tokens.count(model=MODEL, input=follow_up)
    full_tokens = client.responses.input_tokens.count(
        model=MODEL, input=[*HISTORY, follow_up[-1]], tools=TOOLS
    )
    assert compacted_tokens.input_tokens < full_tokens.input_tokens - 1000


def test_compact_a_stored_chain_by_previous_response_id(client: OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="SDK-TEXT")
    compacted = client.responses.compact(model=MODEL, previous_response_id=first.id)
    assert compacted.output[0].content[0].text == "SDK-TEXT"
    assert compacted.output[-1].type == "compaction"


def test_compact_errors(app_url: str, client: OpenAI) -> None:
    missing = httpx.post(
        f"{app_url}/v1/responses/compact", json={"input": "hi"}, headers=AUTH, timeout=30
    )
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "model"
    forged = {"type": "compaction", "encrypted_content": "c2ExAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}
    with pytest.raises(BadRequestError) as error:
        client.responses.create(model=MODEL, input=[forged])
    assert error.value.body["code"] == "invalid_encrypted_content"


# The Open Responses compliance suite's `compact-response` request (src/lib/compliance-tests.ts).
COMPLIANCE_BODY = {
    "model": MODEL,
    "prompt_cache_key": "openresponses-compact-test",
    "input": [
        {
            "type": "message",
            "role": "user",
            "content": "We agreed to launch on Tuesday and notify support first.",
        },
        {
            "type": "message",
            "role": "assistant",
            "content": "Understood. The launch is Tuesday, with support notified beforehand.",
        },
    ],
}


@pytest.mark.parametrize(
    "body",
    [COMPLIANCE_BODY, {"model": MODEL, "input": HISTORY, "tools": TOOLS}],
    ids=["compliance-request", "tool-history"],
)
def test_compact_output_is_valid_open_responses(app_url: str, body: dict) -> None:
    """The specification's compliance test `compact-response` (its schema of the answer, its
    `object`, a `compaction` item): every kept message an item with id, status and content
    parts, usage with its details. Checked against the vendored part of the specification in
    CI (the whole document when it is here)."""
    answer = httpx.post(f"{app_url}/v1/responses/compact", json=body, headers=AUTH, timeout=60)
    assert answer.status_code == 200, answer.text
    compacted = answer.json()
    open_responses.check_compact_resource(compacted)
    assert compacted["object"] == "response.compaction"
    assert [item["type"] for item in compacted["output"]] == ["message", "compaction"]
    message = compacted["output"][0]
    assert message["status"] == "completed" and message["id"].startswith("msg_")
    first = body["input"][0]["content"]
    assert message["content"] == [{"type": "input_text", "text": first}]


def test_compact_output_starts_a_new_websocket_chain(app_url: str, client: OpenAI) -> None:
    """The compliance suite's `websocket-compact-new-chain`: /compact's output, as it came,
    is the whole input of a new WebSocket response (no previous_response_id)."""
    compacted = httpx.post(
        f"{app_url}/v1/responses/compact", json=COMPLIANCE_BODY, headers=AUTH, timeout=60
    )
    assert compacted.status_code == 200, compacted.text
    items = [*compacted.json()["output"], {"role": "user", "content": "When do we launch?"}]
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input=items, store=False)
        while (event := connection.recv()).type not in ("response.completed", "error"):
            assert event.type != "response.failed", event
    assert event.type == "response.completed", event
    assert event.response.usage.input_tokens > 0
