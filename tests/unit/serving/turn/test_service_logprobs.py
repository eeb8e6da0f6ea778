"""Logprobs of the output text (``include: ["message.output_text.logprobs"]``, ``top_logprobs``)
through the real openai SDK, on the in-process app and its simulated engine. The vLLM engine's
mapping of vLLM's DELTA logprobs: tests/unit/engines/test_vllm_engine.py."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from fastapi import FastAPI
from openai.types.responses import Response, ResponseTextDeltaEvent
from openai.types.responses.response_output_text import Logprob

from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client

INCLUDE = ["message.output_text.logprobs"]


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[FastAPI]:
    async with in_process_api(tmp_path / "store.db") as app:
        yield app


def _check_logprobs(entries: list[Logprob], text: str, top: int) -> None:
    assert entries, "no logprobs"
    assert "".join(entry.token for entry in entries) == text
    assert b"".join(bytes(entry.bytes) for entry in entries) == text.encode()
    for entry in entries:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == top
        values = [alt.logprob for alt in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(value) for value in values) <= 1 + 1e-9
        if top:  # the simulated engine samples its most likely token
            assert entry.top_logprobs[0].token == entry.token
            assert entry.top_logprobs[0].logprob == entry.logprob


async def test_streamed_deltas_and_final_text_carry_logprobs(api: FastAPI) -> None:
    client = sdk_client(api)
    deltas: list[ResponseTextDeltaEvent] = []
    async with client.responses.stream(
        model=MODEL, input="hello", include=INCLUDE, top_logprobs=3
    ) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event)
            elif event.type == "response.output_text.done":
                done = event
        final = await stream.get_final_response()
    assert final.top_logprobs == 3
    text = "".join(delta.delta for delta in deltas)
    assert text == final.output_text
    for delta in deltas:
        assert delta.logprobs, "a text delta without logprobs"
        assert "".join(entry.token for entry in delta.logprobs) == delta.delta
        assert all(len(entry.top_logprobs or []) == 3 for entry in delta.logprobs)
    part = final.output[-1].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text"
    assert part.logprobs is not None
    _check_logprobs(part.logprobs, text, 3)
    assert [entry.token for entry in done.logprobs or []] == [e.token for e in part.logprobs]
    assert len(part.logprobs) == sum(len(delta.logprobs) for delta in deltas)


async def test_non_streaming_with_no_alternatives(api: FastAPI) -> None:
    response: Response = await sdk_client(api).responses.create(
        model=MODEL, input="hello", include=INCLUDE, top_logprobs=0
    )
    part = response.output[-1].content[0]  # type: ignore[union-attr]
    assert part.logprobs is not None
    _check_logprobs(part.logprobs, response.output_text, 0)


async def test_include_alone_gives_the_sampled_tokens_logprobs(api: FastAPI) -> None:
    response = await sdk_client(api).responses.create(model=MODEL, input="hi", include=INCLUDE)
    part = response.output[-1].content[0]  # type: ignore[union-attr]
    assert part.logprobs is not None
    _check_logprobs(part.logprobs, response.output_text, 0)


async def test_without_include_logprobs_stay_empty(api: FastAPI) -> None:
    client = sdk_client(api)
    async with client.responses.stream(model=MODEL, input="hello", top_logprobs=5) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert deltas and all(delta.logprobs == [] for delta in deltas)
    part = final.output[-1].content[0]  # type: ignore[union-attr]
    assert part.logprobs == []
    assert final.top_logprobs == 5


async def test_top_logprobs_over_20_is_rejected(api: FastAPI) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        await sdk_client(api).responses.create(
            model=MODEL, input="hi", include=INCLUDE, top_logprobs=21
        )
    assert error.value.status_code == 400


async def test_a_response_with_logprobs_continues_and_is_retrieved(api: FastAPI) -> None:
    client = sdk_client(api)
    first = await client.responses.create(
        model=MODEL, input="hello", include=INCLUDE, top_logprobs=2, store=True
    )
    stored = await client.responses.retrieve(first.id)
    kept = stored.output[-1].content[0]  # type: ignore[union-attr]
    sent = first.output[-1].content[0]  # type: ignore[union-attr]
    assert kept.logprobs and kept.logprobs == sent.logprobs
    # Its output (logprobs and all) is history for the next turn, sent back or by reference.
    again = await client.responses.create(
        model=MODEL,
        input=[
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"role": "user", "content": "more"},
        ],  # type: ignore[list-item]
        store=False,
    )
    follow = await client.responses.create(model=MODEL, input="more", previous_response_id=first.id)
    assert again.status == follow.status == "completed"
