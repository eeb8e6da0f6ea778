"""A blob is never tokenized: it is opened with the server's key, or treated as one it cannot
open. A reasoning item's ``encrypted_content`` the server cannot open is ignored and a
compaction item's is a 400 ``invalid_encrypted_content``, whatever its size: a megabyte without
a break is not the long-piece 400 for text (serve_app.harmony.pieces). Nor is data the model
never reads (an image's or a file's data URL, a hosted tool's settings). The openai SDK and
httpx against the app in this process; over a WebSocket in tests/app/test_websocket.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from openai import AsyncOpenAI

from serve_app.harmony.pieces import MAX_PIECE_CHARS
from tests.support import MODEL
from tests.support.helpers import WEATHER_TOOL, in_process_api, sdk_client

MiB = 1 << 20
# Unbroken runs, each one tokenizer piece if it were read as text: just over the limit, one a
# run too long to look into, a megabyte; of base64's letters and of its punctuation.
SIZES = [MAX_PIECE_CHARS + 1, 100_000, MiB]
UNBROKEN = [*("A" * size for size in SIZES), "-" * MiB, "_" * MiB]
UNBROKEN_IDS = [*(f"A*{size}" for size in SIZES), "dashes", "underscores"]
QUESTION = {"role": "user", "content": "weather in Paris?"}
CALL = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
RESULT = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FastAPI]:
    async with in_process_api(tmp_path / "blobs.db") as api:
        yield api


@pytest.fixture
def client(api: FastAPI) -> AsyncOpenAI:
    return sdk_client(api)


def reasoning(blob: str, **fields: Any) -> dict[str, Any]:
    """A reasoning item as Codex sends it back: no text, the blob only."""
    return {"type": "reasoning", "summary": [], "encrypted_content": blob, **fields}


def tool_loop(*middle: dict[str, Any]) -> list[dict[str, Any]]:
    """A tool step: reasoning between the question and the call is rendered when it opens."""
    return [QUESTION, *middle, CALL, RESULT]


async def count(client: AsyncOpenAI, items: list[Any], **options: Any) -> int:
    counted = await client.responses.input_tokens.count(
        model=MODEL, input=items, tools=[WEATHER_TOOL], **options
    )
    return counted.input_tokens


def error_of(caught: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    body = caught.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}
    return body


@pytest.mark.parametrize("blob", UNBROKEN, ids=UNBROKEN_IDS)
async def test_a_reasoning_blob_that_does_not_open_is_ignored_whatever_its_size(
    client: AsyncOpenAI, blob: str
) -> None:
    with_blob = tool_loop(reasoning(blob))
    assert await count(client, with_blob) == await count(client, tool_loop())
    served = await client.responses.create(
        model=MODEL, input=with_blob, tools=[WEATHER_TOOL], max_output_tokens=16
    )
    assert served.status in ("completed", "incomplete")
    bare = await client.responses.create(
        model=MODEL, input=tool_loop(), tools=[WEATHER_TOOL], max_output_tokens=16
    )
    assert served.usage is not None and bare.usage is not None
    assert served.usage.input_tokens == bare.usage.input_tokens


@pytest.mark.parametrize("blob", UNBROKEN, ids=UNBROKEN_IDS)
async def test_a_compaction_blob_that_does_not_open_is_a_400_naming_it_whatever_its_size(
    client: AsyncOpenAI, blob: str
) -> None:
    items = [QUESTION, {"type": "compaction", "encrypted_content": blob}]
    for call in (client.responses.create, client.responses.input_tokens.count):
        with pytest.raises(openai.BadRequestError) as caught:
            await call(model=MODEL, input=items)
        error = error_of(caught)
        assert (error["code"], error["param"]) == (
            "invalid_encrypted_content",
            "input[1].encrypted_content",
        )
        assert error["type"] == "invalid_request_error"


async def test_sealed_blobs_still_open_and_render(client: AsyncOpenAI) -> None:
    created = await client.responses.create(
        model=MODEL, input="think", store=False, include=["reasoning.encrypted_content"]
    )
    sealed = next(item for item in created.output if item.type == "reasoning")
    assert sealed.encrypted_content
    assert await count(client, tool_loop(reasoning(sealed.encrypted_content))) > await count(
        client, tool_loop()
    )
    compacted = await client.responses.compact(model=MODEL, input="a long history")
    item = compacted.output[-1].model_dump(exclude_none=True)
    resumed = await client.responses.create(
        model=MODEL, input=[item, {"role": "user", "content": "go on"}], max_output_tokens=16
    )
    assert resumed.status in ("completed", "incomplete")


async def test_the_text_of_a_reasoning_item_is_still_judged_as_text(client: AsyncOpenAI) -> None:
    said = reasoning("A" * MiB, content=[{"type": "reasoning_text", "text": "y" * MiB}])
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model=MODEL, input=tool_loop(said), tools=[WEATHER_TOOL])
    error = error_of(caught)
    assert error["param"] == "input[1].content[0].text"
    assert f"{MiB:,} characters without a break" in error["message"]


async def test_blobs_in_conversation_items(client: AsyncOpenAI) -> None:
    # Added as any unopenable blob is (a conversation's items are not opened until rendered).
    blob = "A" * MiB
    thinking = await client.conversations.create(items=[QUESTION, reasoning(blob)])
    served = await client.responses.create(
        model=MODEL, conversation=thinking.id, input="and tomorrow?", max_output_tokens=16
    )
    assert served.status in ("completed", "incomplete")
    added = await client.conversations.create()
    await client.conversations.items.create(
        added.id, items=[{"type": "compaction", "encrypted_content": blob}]
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model=MODEL, conversation=added.id, input="go on")
    assert (error_of(caught)["code"], error_of(caught)["param"]) == (
        "invalid_encrypted_content",
        "conversation",
    )


async def test_a_stored_blob_reached_by_previous_response_id_or_reference(
    client: AsyncOpenAI,
) -> None:
    blob = "A" * MiB
    first = await client.responses.create(
        model=MODEL, input=tool_loop(reasoning(blob, id="rs_big")), tools=[WEATHER_TOOL]
    )
    bare = await client.responses.create(model=MODEL, input=tool_loop(), tools=[WEATHER_TOOL])
    assert first.usage is not None and bare.usage is not None
    assert first.usage.input_tokens == bare.usage.input_tokens
    then = {"role": "user", "content": "and tomorrow?"}
    continued = await client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[then], tools=[WEATHER_TOOL]
    )
    assert continued.status in ("completed", "incomplete")
    by_reference = tool_loop({"type": "item_reference", "id": "rs_big"})
    assert await count(client, by_reference) == await count(client, tool_loop())


async def test_data_the_model_never_reads_is_not_judged_as_text(api: FastAPI) -> None:
    # A megabyte of base64 without a break (zeros: "AAAA..."), as an image, a file, and a
    # hosted tool's mask: images and files become a note; the image_generation tool is refused
    # for what it is (no image model here), never judged as text.
    data = "data:image/png;base64," + "A" * MiB
    parts = [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": data},
        {"type": "input_file", "filename": "a.pdf", "file_data": data},
    ]
    mask_tool = {"type": "image_generation", "input_image_mask": {"image_url": data}}
    body = {
        "model": MODEL,
        "input": [{"role": "user", "content": parts}],
        "tools": [mask_tool],
        "max_output_tokens": 16,
    }
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        refused = await http.post("/v1/responses", json=body, timeout=60)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "tools[0].type"
        body["tools"] = []
        served = await http.post("/v1/responses", json=body, timeout=60)
        assert served.status_code == 200, served.text
        assert served.json()["status"] in ("completed", "incomplete")
        as_a_note = {**body, "input": [{"role": "user", "content": parts[:1]}], "tools": []}
        del as_a_note["max_output_tokens"]
        text_only = await http.post("/v1/responses/input_tokens", json=as_a_note)
        del body["max_output_tokens"]
        with_data = await http.post("/v1/responses/input_tokens", json=body)
    # The data adds only the two notes, the same whatever its size.
    notes = with_data.json()["input_tokens"] - text_only.json()["input_tokens"]
    assert 0 < notes < 40
