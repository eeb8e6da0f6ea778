"""Compaction: POST /v1/responses/compact with the openai SDK, and the compaction item sent back
in a later input renders as the summary in place of the history it replaced."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import BadRequestError, OpenAI

from serve_app.config import AppArgs, Limits
from serve_app.harmony import compaction
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import render_request
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.admission import responses as validation
from tests.helpers import decode, in_process_api, sdk_client

MODEL = "gpt-oss-120b"
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
OLD_OUTPUT = "OLD-TOOL-OUTPUT " + "sunny and warm, " * 300
HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "type": "function_call",
        "call_id": "call_w",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    },
    {"type": "function_call_output", "call_id": "call_w", "output": OLD_OUTPUT},
    {"role": "assistant", "content": "OLD-ANSWER: it is sunny."},
]


@pytest.fixture
def client(app_url: str) -> OpenAI:
    return OpenAI(base_url=f"{app_url}/v1", api_key="unused")


def test_a_compaction_item_renders_as_its_summary() -> None:
    vault = ReasoningVault("test")
    item = {"type": "compaction", "encrypted_content": compaction.seal_summary(vault, "SUMMARY-X")}
    request = ResponsesRequest.model_validate(
        {"model": MODEL, "input": [HISTORY[0], item, {"role": "user", "content": "go on"}]}
    )
    text = decode(render_request(request, vault=vault).token_ids)
    assert compaction.SUMMARY_PREFIX + "SUMMARY-X" in text
    assert text.index("SUMMARY-X") < text.index("go on")
    # A reasoning blob sealed by the same server is not a summary.
    item["encrypted_content"] = vault.seal("not a summary")
    forged = ResponsesRequest.model_validate({"model": MODEL, "input": [item]})
    with pytest.raises(InvalidRequest, match="could not be opened"):
        validation.check_items(forged, vault=vault)


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
    missing = httpx.post(f"{app_url}/v1/responses/compact", json={"input": "hi"}, timeout=30)
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "model"
    forged = {"type": "compaction", "encrypted_content": "c2ExAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}
    with pytest.raises(BadRequestError) as error:
        client.responses.create(model=MODEL, input=[forged])
    assert error.value.body["code"] == "invalid_encrypted_content"


async def test_compact_counts_the_clients_items_against_max_input_items(tmp_path) -> None:
    # The model is asked with the history plus one summary request, and with a stored chain
    # folded into its input: neither is the client's to keep within the limit.
    args = AppArgs(limits=Limits(max_input_items=4))
    async with in_process_api(tmp_path / "compact.db", args) as api:
        client = sdk_client(api)
        four = [{"role": "user", "content": f"message {index}"} for index in range(4)]
        compacted = await client.responses.compact(model=MODEL, input=four)
        assert [item.type for item in compacted.output] == ["message"] * 4 + ["compaction"]
        stored = await client.responses.create(model=MODEL, input=four, store=True)
        chained = await client.responses.compact(
            model=MODEL, previous_response_id=stored.id, input=four
        )
        assert chained.output[-1].type == "compaction"
        with pytest.raises(openai.BadRequestError, match="at most 4"):
            await client.responses.compact(model=MODEL, input=[*four, four[0]])
