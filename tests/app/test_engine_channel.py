"""The channel between engine and ingress replicas through Serve: the session app streams its
requests over channels (serve_app.serving.engine.channel) without losing a token, and a client
leaving does not close the channel its request opened. Without Ray:
tests/unit/serving/engine/test_channel.py."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from openai import AsyncOpenAI

from serve_app.serving.engine.channel import CHANNEL_IDLE_S
from tests.support import API_KEY, MODEL
from tests.support.helpers import scrape_metrics


def _engine_streams(app_url: str) -> dict[str, Any]:
    """Engine requests by path (channel / own), summed over the ingress replicas, and which
    replicas answered the scrape (so a failure says whose counters it summed)."""
    pattern = r'^serve_app_engine_streams_total\{path="(\w+)"\} ([0-9.e+]+)$'
    totals: dict[str, Any] = {"channel": 0.0, "own": 0.0}
    pages = scrape_metrics(app_url)
    for page in pages.values():
        for path, value in re.findall(pattern, page, re.M):
            totals[path] += float(value)
    totals["replicas"] = sorted(pages)
    return totals


async def _streamed_text(client: AsyncOpenAI, key: str) -> tuple[str, str, str]:
    """A streamed turn: the text its deltas spell, its last event's type, the final text."""
    deltas: list[str] = []
    last = None
    stream = await client.responses.create(
        model=MODEL, input=f"SDK-TEXT: channel {key}", prompt_cache_key=key, stream=True
    )
    async for event in stream:
        last = event
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    assert last is not None
    return "".join(deltas), last.type, last.response.output_text


async def test_the_app_streams_its_requests_over_channels_without_losing_a_token(
    app_url: str,
) -> None:
    before = _engine_streams(app_url)
    async with AsyncOpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, max_retries=0) as client:
        # Back to back, so the channels opened by the first round stay open; 4 at once, within
        # the test app's queue of 4 per ingress replica (a burst of 8 on one would be a 429).
        for round_ in range(6):
            turns = await asyncio.gather(
                *(_streamed_text(client, f"channel-{round_}-{i}") for i in range(4))
            )
            for streamed, last_type, final in turns:
                assert last_type == "response.completed"
                assert final and streamed == final  # every delta, in order, once
    after = _engine_streams(app_url)
    on_channel = after["channel"] - before["channel"]
    # At most one request per (ingress, engine replica) pair streams on its own before the
    # pair's channel is open, or a round's worth while it opens.
    assert on_channel >= 8, (before, after)


async def _until(stream: Any, event_type: str) -> None:
    async for event in stream:
        if event.type == event_type:
            return
    pytest.fail(f"the stream ended before {event_type}")


async def test_a_client_leaving_does_not_close_the_channel_its_request_opened(
    app_url: str,
) -> None:
    """The channel is opened while a request streams (its first chunk names the replica); the
    client of that request leaving must not end it for the requests riding it."""
    await asyncio.sleep(CHANNEL_IDLE_S + 0.5)  # earlier tests' channels closed: the next opens one
    key = "channel-opener"
    async with AsyncOpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, max_retries=0) as client:
        opener = await client.responses.create(
            model=MODEL, input="SDK-SLOW: open", prompt_cache_key=key, stream=True
        )
        await _until(opener, "response.reasoning_text.done")  # its engine call runs on

        async def ride(index: int) -> tuple[str, str]:
            stream = await client.responses.create(
                model=MODEL, input=f"SDK-PAUSE: {index}", prompt_cache_key=key, stream=True
            )
            last = None
            async for event in stream:
                last = event
                if event.type == "response.reasoning_text.done":
                    riding.append(index)
            assert last is not None
            return last.type, last.response.output_text

        riding: list[int] = []
        riders = [asyncio.create_task(ride(index)) for index in range(6)]
        for _ in range(100):  # every rider mid-turn (in its pause), most on a channel
            if len(riding) == len(riders):
                break
            await asyncio.sleep(0.05)
        await opener.close()  # the opener's client leaves
        for last_type, text in await asyncio.gather(*riders):
            assert (last_type, text) == ("response.completed", "Back after the pause.")
