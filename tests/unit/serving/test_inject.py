"""``response.inject`` (the beta ``OpenAI-Beta: responses_multi_agent=v1``) against the app in
this process (uvicorn, the scripted simulated engine), through the openai SDK's beta WebSocket
client (``client.beta.responses.connect``): a response whose model called a client-run tool
waits for the outputs, and the ones injected resume it in place (the same response id, one
stream, one stored response); every refusal; and the races as they happen (an inject meeting
the wait's end, two at once, from another connection, after the connection that owned the
response closed), over many interleavings. Every event is validated by the SDK's beta types and,
but for the inject events the GA types do not have, by its GA types too."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.beta.beta_responses_server_event import BetaResponsesServerEvent
from openai.types.responses import Response
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from serve_app.config import AppArgs, Limits
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from tests.support import ENGINE_SCRIPT, MODEL
from tests.support.helpers import in_process_api, on_uvicorn
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
INJECT_EVENTS = ("response.inject.created", "response.inject.failed")


@asynccontextmanager
async def beta_app(
    tmp_path: Path, wait_s: float = 10.0
) -> AsyncIterator[tuple[AsyncOpenAI, SimulatedEngine]]:
    """The app on uvicorn, a response waiting ``wait_s`` for injected outputs: an SDK client
    for it, and its engine."""
    scripted = SimulatedEngineConfig(script=str(ENGINE_SCRIPT), decode_tokens_per_s=50_000)
    args = AppArgs(limits=Limits(websocket_inject_wait_s=wait_s))
    async with (
        in_process_api(tmp_path / "inject.db", args, engine=scripted) as api,
        on_uvicorn(api) as url,
    ):
        yield AsyncOpenAI(base_url=f"{url}/v1", api_key="unused"), api.state.engine


def checked(raw: bytes | str) -> dict[str, Any]:
    """One server event as sent, validated by the SDK's beta types and (events the GA types
    know) its GA types; its JSON."""
    event = json.loads(raw)
    BETA_EVENT.validate_python(event)
    if event["type"] not in INJECT_EVENTS:
        GA_EVENT.validate_python(event)
    return event


async def events_until(connection: Any, done: Any, timeout: float = 20) -> list[dict[str, Any]]:
    """Checked events until ``done(event)`` (that one included)."""
    events = []
    while True:
        event = checked(await asyncio.wait_for(connection.recv_bytes(), timeout))
        events.append(event)
        if done(event):
            return events


def is_terminal(event: dict[str, Any]) -> bool:
    return event["type"] in TERMINAL


def call_made(event: dict[str, Any]) -> bool:
    return event["type"] == "response.output_item.done" and event["item"]["type"] == "function_call"


def output(call_id: str, text: str = "INJECTED-OUTPUT: sunny") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def numbered_in_order(events: list[dict[str, Any]]) -> None:
    numbers = [event["sequence_number"] for event in events]
    assert numbers == list(range(len(numbers))), [(e["type"], e["sequence_number"]) for e in events]


async def waiting_call(connection: Any, **options: Any) -> tuple[list[dict[str, Any]], str, str]:
    """A response whose model calls get_weather, up to that call: its events, id, call id."""
    await connection.response.create(
        model=MODEL, input="SDK-TOOL: weather in Paris?", tools=[WEATHER_TOOL], **options
    )
    events = await events_until(connection, call_made)
    return events, events[0]["response"]["id"], events[-1]["item"]["call_id"]


# --- resumed in place ----------------------------------------------------------------------


async def test_injected_output_resumes_the_response_in_place_and_is_stored_in_it(
    tmp_path: Path,
) -> None:
    async with (
        beta_app(tmp_path) as (client, engine),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        before, response_id, call_id = await waiting_call(connection, store=True)
        sent = [output(call_id)]
        await connection.response.inject(response_id=response_id, input=sent)
        after = await events_until(connection, is_terminal)
        assert engine.num_ongoing_requests() == 0
        stored = await client.responses.retrieve(response_id)
        inputs = await client.responses.input_items.list(response_id)
        # A later turn continues it as any response: the injected output is in its history.
        await connection.response.create(
            model=MODEL, input="SDK-TEXT: and then?", previous_response_id=response_id
        )
        later = await events_until(connection, is_terminal)
        over_http = await client.responses.create(
            model=MODEL, input="SDK-TEXT: and then?", previous_response_id=response_id
        )
    assert later[-1]["type"] == "response.completed"
    assert over_http.status == "completed"
    # The same history over the socket (its memory) and from the store.
    assert later[-1]["response"]["usage"]["input_tokens"] == over_http.usage.input_tokens
    events = before + after
    numbered_in_order(events)  # one stream: the inject's event numbered in it
    assert [e["type"] for e in events].count("response.created") == 1
    created = next(e for e in after if e["type"] == "response.inject.created")
    assert created == {
        "type": "response.inject.created",
        "response_id": response_id,
        "sequence_number": created["sequence_number"],
    }
    placed = [e for e in after if e.get("item", {}).get("type") == "function_call_output"]
    assert [e["type"] for e in placed] == [
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert placed[1]["item"]["call_id"] == call_id and placed[1]["item"]["status"] == "completed"
    assert placed[1]["item"]["id"].startswith("fco_")
    assert after.index(created) < after.index(placed[0])
    done = Response.model_validate(after[-1]["response"])
    assert after[-1]["type"] == "response.completed" and done.id == response_id
    assert [item.type for item in done.output] == [
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
    ]
    assert done.output_text == "Read the injected output."
    # The continuation found the first completion's prompt in the engine's prefix cache.
    assert done.usage.input_tokens_details.cached_tokens > 0
    # One stored response, the injected output and the continued output in it; its input as
    # the client sent it.
    assert stored.model_dump(mode="json") == done.model_dump(mode="json")
    assert [item.type for item in inputs.data] == ["message"]


async def test_a_response_owing_two_calls_waits_for_both_outputs(tmp_path: Path) -> None:
    async with (
        beta_app(tmp_path) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        await connection.response.create(
            model=MODEL, input="INJECT-TWO: two cities", tools=[WEATHER_TOOL], store=False
        )
        events = await events_until(connection, call_made)
        events += await events_until(connection, call_made)
        response_id = events[0]["response"]["id"]
        first, second = (e["item"]["call_id"] for e in events if call_made(e))
        await connection.response.inject(response_id=response_id, input=[output(first, "Paris")])
        (created,) = await events_until(connection, lambda e: True)
        assert created["type"] == "response.inject.created"
        # Still waiting for the other call: nothing more comes until its output does.
        with pytest.raises(TimeoutError):
            await events_until(connection, lambda e: True, timeout=0.3)
        await connection.response.inject(response_id=response_id, input=[output(second)])
        after = await events_until(connection, is_terminal)
    numbered_in_order([*events, created, *after])
    assert after[0]["type"] == "response.inject.created"
    done = Response.model_validate(after[-1]["response"])
    assert [item.type for item in done.output][:5] == [
        "reasoning",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    assert done.output_text == "Read the injected output."


# --- without waiting -----------------------------------------------------------------------


async def test_without_the_beta_header_inject_is_an_error_naming_the_beta(tmp_path: Path) -> None:
    async with (
        beta_app(tmp_path) as (client, _),
        client.beta.responses.connect() as connection,
    ):
        # Without the beta a response ends with its call, as it always did.
        _, response_id, call_id = await waiting_call(connection, store=False)
        rest = await events_until(connection, is_terminal)
        assert rest[-1]["type"] == "response.completed"
        await connection.response.inject(response_id=response_id, input=[output(call_id)])
        (error,) = await events_until(connection, lambda e: True)
    assert error["type"] == "error" and error["status"] == 400
    assert error["error"]["type"] == "invalid_request_error"
    assert "OpenAI-Beta: responses_multi_agent=v1" in error["error"]["message"]


async def test_unwaited_response_ends_after_the_wait_and_continues_as_today(
    tmp_path: Path,
) -> None:
    async with (
        beta_app(tmp_path, wait_s=0.2) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        _, response_id, call_id = await waiting_call(connection, store=False)
        rest = await events_until(connection, is_terminal)
        assert rest[-1]["type"] == "response.completed"
        assert [i["type"] for i in rest[-1]["response"]["output"]] == ["reasoning", "function_call"]
        # Too late: the response ended.
        late = [output(call_id)]
        await connection.response.inject(response_id=response_id, input=late)
        (failed,) = await events_until(connection, lambda e: True)
        assert failed == {
            "type": "response.inject.failed",
            "response_id": response_id,
            "input": late,
            "error": {"code": "response_already_completed", "message": failed["error"]["message"]},
            "sequence_number": rest[-1]["sequence_number"] + 1,
        }
        # The output goes in a response.create continuing it, as without the beta.
        await connection.response.create(
            model=MODEL, input=late, previous_response_id=response_id, store=False
        )
        following = await events_until(connection, is_terminal)
    assert following[-1]["type"] == "response.completed"
    assert following[-1]["response"]["output"][-1]["content"][0]["text"] == (
        "Read the injected output."
    )


async def test_a_response_create_continuing_a_waiting_response_ends_its_wait(
    tmp_path: Path,
) -> None:
    async with (
        beta_app(tmp_path, wait_s=30) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        _, response_id, call_id = await waiting_call(connection, store=False)
        # The client answers the old way: the waiting response completes with its call now,
        # and the continuation (queued behind it on the lane) runs.
        await connection.response.create(
            model=MODEL, input=[output(call_id)], previous_response_id=response_id, store=False
        )
        first = await asyncio.wait_for(events_until(connection, is_terminal), 5)
        second = await events_until(connection, is_terminal)
    assert first[-1]["type"] == "response.completed"
    assert first[-1]["response"]["id"] == response_id
    assert second[-1]["response"]["previous_response_id"] == response_id
    assert second[-1]["type"] == "response.completed"


# --- refusals ------------------------------------------------------------------------------


async def test_an_unknown_response_is_not_found(tmp_path: Path) -> None:
    async with (
        beta_app(tmp_path) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        sent = [output("call_nowhere")]
        await connection.response.inject(response_id="resp_nowhere", input=sent)
        (failed,) = await events_until(connection, lambda e: True)
    assert failed["type"] == "response.inject.failed"
    assert failed["error"]["code"] == "response_not_found"
    assert failed["input"] == sent and failed["sequence_number"] == 0
    assert failed["response_id"] == "resp_nowhere"


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([output("call_not_made")], "input[0].call_id"),
        ([{"type": "message", "role": "user", "content": "hi"}], "input[0].type"),
        ([{"type": "function_call_output", "output": "no call id"}], "input[0].call_id"),
        ([], "input"),
        # One tokenizer piece past the limit a request's input is held to: never tokenized.
        ([output("call_not_made", "a" * 30_000)], "input[0].output"),
    ],
    ids=["unknown call", "not a tool output", "malformed", "empty", "a piece too long"],
)
async def test_an_invalid_inject_is_a_400_naming_the_item_and_commits_nothing(
    tmp_path: Path, items: list[dict[str, Any]], param: str
) -> None:
    async with (
        beta_app(tmp_path) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        _, response_id, call_id = await waiting_call(connection, store=False)
        # Valid items beside an invalid one are not committed either (all or nothing).
        sent = [*items, output(call_id)] if items else items
        await connection.response.inject(response_id=response_id, input=sent)
        (error,) = await events_until(connection, lambda e: True)
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["param"] == param, error
        # Still waiting: a valid inject resumes it.
        await connection.response.inject(response_id=response_id, input=[output(call_id)])
        after = await events_until(connection, is_terminal)
    assert after[0]["type"] == "response.inject.created"
    assert after[-1]["response"]["output"][2]["type"] == "function_call_output"
    assert [e["type"] for e in after].count("response.inject.created") == 1


# --- races ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
async def test_an_inject_meeting_the_end_of_the_wait_is_committed_or_refused_never_lost(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    wait_s = rng.uniform(0.02, 0.12)
    async with (
        beta_app(tmp_path, wait_s=wait_s) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        before, response_id, call_id = await waiting_call(connection, store=True)
        await asyncio.sleep(rng.uniform(0, 2 * wait_s))
        await connection.response.inject(response_id=response_id, input=[output(call_id)])
        after = await events_until(
            connection,
            lambda e: (
                e["type"] == "response.inject.failed"
                or (is_terminal(e) and e["response"]["output"][-1]["type"] == "message")
            ),
        )
        stored = await client.responses.retrieve(response_id)
    kinds = [e["type"] for e in after]
    terminals = [e for e in after if is_terminal(e)]
    assert len(terminals) == 1, kinds
    if "response.inject.created" in kinds:  # committed: resumed in place
        assert "response.inject.failed" not in kinds
        assert terminals[0]["response"]["output"][2]["call_id"] == call_id
        numbered_in_order(before + after)
    else:  # refused: the response had ended with its call, as without the beta
        assert kinds[-1] == "response.inject.failed", kinds
        assert after[-1]["error"]["code"] == "response_already_completed"
        assert [i["type"] for i in terminals[0]["response"]["output"]] == [
            "reasoning",
            "function_call",
        ]
        numbered_in_order(before + after)
    # Stored once, as it ended: what the terminal event carried.
    assert stored.model_dump(mode="json") == Response.model_validate(
        terminals[0]["response"]
    ).model_dump(mode="json")


@pytest.mark.parametrize("seed", range(8))
async def test_two_injects_at_once_commit_once(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with (
        beta_app(tmp_path) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        _, response_id, call_id = await waiting_call(connection, store=False)
        first, second = output(call_id, "INJECTED-OUTPUT one"), output(call_id, "two")
        await connection.response.inject(response_id=response_id, input=[first])
        if rng.random() < 0.5:
            await asyncio.sleep(rng.uniform(0, 0.01))
        await connection.response.inject(response_id=response_id, input=[second])
        events = await events_until(connection, is_terminal)
        if not any(e["type"] in ("error", "response.inject.failed") for e in events):
            events += await events_until(
                connection, lambda e: e["type"] in ("error", "response.inject.failed")
            )
    kinds = [e["type"] for e in events]
    assert kinds.count("response.inject.created") == 1, kinds
    refusal = next(e for e in events if e["type"] in ("error", "response.inject.failed"))
    if refusal["type"] == "error":  # the call had its output already
        assert refusal["status"] == 400 and refusal["error"]["param"] == "input[0].call_id"
    else:  # the response had ended already
        assert refusal["error"]["code"] == "response_already_completed"
        assert refusal["input"] == [second]
    done = next(e for e in events if is_terminal(e))["response"]
    outputs = [i for i in done["output"] if i["type"] == "function_call_output"]
    assert [i["output"] for i in outputs] == ["INJECTED-OUTPUT one"]


async def test_an_inject_from_another_connection_finds_no_response(tmp_path: Path) -> None:
    async with (
        beta_app(tmp_path) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as owner,
        client.beta.responses.connect(extra_headers=BETA) as other,
    ):
        _, response_id, call_id = await waiting_call(owner, store=False)
        await other.response.inject(response_id=response_id, input=[output(call_id)])
        (failed,) = await events_until(other, lambda e: True)
        assert failed["type"] == "response.inject.failed"
        assert failed["error"]["code"] == "response_not_found"
        # The owner's response still waits, and resumes with the owner's inject.
        await owner.response.inject(response_id=response_id, input=[output(call_id)])
        after = await events_until(owner, is_terminal)
    assert after[0]["type"] == "response.inject.created"
    assert after[-1]["type"] == "response.completed"


async def test_an_inject_after_its_connection_closed_finds_no_response(tmp_path: Path) -> None:
    async with beta_app(tmp_path) as (client, engine):
        async with client.beta.responses.connect(extra_headers=BETA) as owner:
            _, response_id, call_id = await waiting_call(owner, store=True)
        # The connection closed mid-wait: the response was cancelled with it.
        async with client.beta.responses.connect(extra_headers=BETA) as other:
            await other.response.inject(response_id=response_id, input=[output(call_id)])
            (failed,) = await events_until(other, lambda e: True)
        assert engine.num_ongoing_requests() == 0
    assert failed["type"] == "response.inject.failed"
    assert failed["error"]["code"] == "response_not_found"


async def test_a_steer_while_waiting_ends_the_response_after_the_outputs(tmp_path: Path) -> None:
    async with (
        beta_app(tmp_path) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        _, response_id, call_id = await waiting_call(connection, store=False)
        await connection.response.steer(previous_response_id=response_id, input="SDK-TEXT: stop")
        (accepted,) = await events_until(connection, lambda e: True)
        assert accepted["type"] == "response.steer.accepted"
        await connection.response.inject(response_id=response_id, input=[output(call_id)])
        steered = await events_until(connection, is_terminal)
        successor = await events_until(connection, is_terminal)
    assert steered[0]["type"] == "response.inject.created"
    # At the first safe boundary after the outputs: they are in, nothing of the model's after.
    assert steered[-1]["type"] == "response.incomplete"
    assert steered[-1]["response"]["incomplete_details"] == {"reason": "steered"}
    assert [i["type"] for i in steered[-1]["response"]["output"]] == [
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert successor[-1]["response"]["previous_response_id"] == response_id
    assert successor[-1]["response"]["output"][-1]["type"] == "message"


async def test_an_inject_naming_a_lane_is_a_400_naming_stream_id(tmp_path: Path) -> None:
    async with (
        beta_app(tmp_path) as (client, _),
        client.beta.responses.connect(extra_headers=BETA) as connection,
    ):
        _, response_id, call_id = await waiting_call(connection, store=False)
        event = {"type": "response.inject", "response_id": response_id, "input": [output(call_id)]}
        await connection.send({**event, "stream_id": "elsewhere"})  # type: ignore[arg-type]
        (error,) = await events_until(connection, lambda e: True)
        assert error["type"] == "error" and error["error"]["param"] == "stream_id"
        await connection.send(event)  # type: ignore[arg-type]
        after = await events_until(connection, is_terminal)
    assert after[0]["type"] == "response.inject.created"
