"""The tool loop inside one response (serve_app/serving/tools/loop.py), with the test kind
``echo`` (tests/support/echo_tool.py) as the tool the server runs: the whole API in this
process, the scripted engine playing the model (a turn is chosen by the tool output it reads).

Every stream read here is checked event by event against the openai SDK's
``ResponseStreamEvent`` union, its sequence numbers and output indices (`check_stream`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from openai.types.responses import ResponseStreamEvent
from prometheus_client.parser import text_string_to_metric_families
from pydantic import TypeAdapter

from serve_app.config import AppArgs
from serve_app.engines.base import GenerateChunk, GenerateRequest
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.tool_items import ToolResult
from serve_app.serving.engine.client import InProcessEngineClient
from serve_app.serving.ingress import create_api
from serve_app.serving.tools.contract import ToolCall, ToolRunners
from serve_app.serving.turn.state import Ask
from serve_app.store.sql import SqlResponseStore
from tests.support import MODEL
from tests.support.echo_tool import EchoProvider, EchoRunner, echo_runners, register_echo
from tests.support.helpers import WEATHER_TOOL, decode, on_uvicorn, sdk_client
from tests.support.websocket import TERMINAL

EVENT = TypeAdapter(ResponseStreamEvent)


def call(text: str) -> dict[str, Any]:
    """A scripted call of the echo tool (``to=testtools.echo``)."""
    return {
        "function_call": {"name": "echo", "namespace": "testtools", "arguments": {"text": text}}
    }


def undeclared(name: str) -> dict[str, Any]:
    """A scripted call of a function no request here declares (``to=functions.NAME``)."""
    return {"function_call": {"name": name, "arguments": {"secret": "ARGS-NEVER-LOGGED"}}}


WEATHER_CALL = {"function_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
REPO_SEARCH = {"builtin_call": {"to": "repo_browser.search", "input": {"query": "loop"}}}
MANY = [f"c{i}" for i in range(5)]
SCRIPT = {
    "turns": [
        {"match": "echo: hi", "items": [{"reasoning": "Yes."}, {"text": "The tool said hi."}]},
        {"match": "ONE-CALL", "items": [{"reasoning": "Call echo."}, call("hi")]},
        {"match": "echo: slow2", "items": [{"text": "Both are done."}]},
        {"match": "TWO-SLOW", "items": [call("slow1"), call("slow2")]},
        {"match": "echo: c4", "items": [{"text": "All five are done."}]},
        {"match": "MANY-CALLS", "items": [call(text) for text in MANY]},
        {"match": "tool failed", "items": [{"text": "The tool broke."}]},
        {"match": "BROKEN", "items": [call("raise")]},
        {"match": "echo refused", "items": [{"text": "The tool refused."}]},
        {"match": "REFUSED", "items": [call("fail")]},
        {"match": "echo: l2", "items": [{"text": "Two of three ran."}]},
        {"match": "LIMIT", "items": [call("l1"), call("l2"), call("l3")]},
        {"match": "APPROVE", "items": [call("approve")]},
        {"match": "MIXED", "items": [call("m1"), {"function_call": {"name": "get_weather"}}]},
        {"match": "echo: again", "items": [call("again")]},
        {"match": "LOOP", "items": [call("again")]},
        {"match": "HANG", "items": [{"reasoning": "Hang."}, call("hang"), call("hang2")]},
        {"match": "not passed on", "items": [{"text": "It was too large."}]},
        {"match": "BIG-ONE", "items": [call("big")]},
        {"match": "BIG-TWO", "items": [call("big1"), call("big2")]},
        # Calls of tools the request does not have: answered by the server, never shown.
        {"match": 'named "repo_browser.search"', "items": [{"text": "No repo browser here."}]},
        {"match": "UNKNOWN-ONE", "items": [{"reasoning": "Search the repo."}, REPO_SEARCH]},
        {"match": 'named "functions.nowhere"', "items": [undeclared("nowhere")]},
        {"match": "UNKNOWN-REPEAT", "items": [undeclared("nowhere")]},
        {"match": "echo: u2", "items": [{"text": "Two ran, one was no tool."}]},
        {"match": "UNKNOWN-BESIDE", "items": [call("u1"), undeclared("gone"), call("u2")]},
        {"match": "Not run", "items": [{"text": "The second was not run."}]},
        {"match": "UNKNOWN-TWO", "items": [undeclared("one"), undeclared("two")]},
        {"match": 'named "functions.first"', "items": [{"text": "Answered after the limit."}]},
        {"match": "UNKNOWN-FIRST", "items": [undeclared("first"), call("late")]},
        {"match": "Sunny", "items": [{"text": "It is sunny."}]},
        {"match": "UNKNOWN-WITH-CLIENT", "items": [undeclared("ghost"), WEATHER_CALL]},
    ]
}  # fmt: skip


class RecordingEngineClient:
    """The in-process engine client, recording each engine request and its output tokens."""

    def __init__(self, inner: InProcessEngineClient) -> None:
        self._inner = inner
        self.requests: list[GenerateRequest] = []
        self.outputs: list[list[int]] = []

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        self.requests.append(request)
        tokens: list[int] = []
        self.outputs.append(tokens)
        async for chunk in self._inner.stream(request):
            tokens.extend(chunk.token_ids)
            yield chunk


@dataclass
class LoopApp:
    api: Any
    engine: RecordingEngineClient
    runner: EchoRunner
    http: httpx.AsyncClient = field(init=False)

    def __post_init__(self) -> None:
        transport = httpx.ASGITransport(app=self.api)
        self.http = httpx.AsyncClient(transport=transport, base_url="http://app", timeout=30)

    @property
    def sdk(self) -> AsyncOpenAI:
        return sdk_client(self.api)

    async def stream(self, **body: Any) -> list[dict[str, Any]]:
        """The SSE stream's events, as JSON, checked (`check_stream`)."""
        body = {"model": MODEL, "stream": True, **body}
        async with self.http.stream("POST", "/v1/responses", json=body) as answer:
            assert answer.status_code == 200, await answer.aread()
            events = [
                json.loads(line[6:])
                async for line in answer.aiter_lines()
                if line.startswith("data: ")
            ]
        check_stream(events)
        return events


@contextlib.asynccontextmanager
async def loop_app(
    tmp_path: Path,
    runner: EchoRunner | None = None,
    *,
    max_rounds: int = 8,
    runners: ToolRunners | None = None,
    args: AppArgs | None = None,
) -> AsyncIterator[LoopApp]:
    store = SqlResponseStore(f"sqlite+aiosqlite:///{tmp_path / 'loop.db'}")
    await store.start()
    simulated = SimulatedEngine(SimulatedEngineConfig(script=SCRIPT, decode_tokens_per_s=50_000))
    await simulated.start()
    engine = RecordingEngineClient(InProcessEngineClient(simulated))
    runner = runner or EchoRunner()
    tools = runners if runners is not None else echo_runners(runner, max_rounds=max_rounds)
    args = args or AppArgs()
    api = create_api(args, engine, ReasoningVault("k"), store, tools=tools)  # type: ignore[arg-type]
    app = LoopApp(api, engine, runner)
    try:
        yield app
    finally:
        await app.http.aclose()
        await api.state.service.aclose()
        await simulated.shutdown()
        await store.close()


def check_stream(events: list[dict[str, Any]]) -> None:
    """Every event an SDK ``ResponseStreamEvent``; sequence numbers 0, 1, 2...; each item
    added once and done once at its own output index, indices 0, 1, 2... in order; one
    terminal event, the last, whose output is the done items in index order."""
    for event in events:
        EVENT.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == list(range(len(added)))
    assert sorted(e["output_index"] for e in done) == list(range(len(added)))
    ids = {e["output_index"]: e["item"]["id"] for e in added}
    assert all(ids[e["output_index"]] == e["item"]["id"] for e in done)
    terminal = [e for e in events if e["type"] in TERMINAL]
    assert len(terminal) == 1 and terminal[0] is events[-1]
    by_index = sorted(done, key=lambda e: e["output_index"])
    assert [item["id"] for item in terminal[0]["response"]["output"]] == [
        e["item"]["id"] for e in by_index
    ]


def final(events: list[dict[str, Any]]) -> dict[str, Any]:
    return events[-1]["response"]


def types_of(response: dict[str, Any]) -> list[str]:
    return [item["type"] for item in response["output"]]


# --- one call, end to end -------------------------------------------------------------------


async def test_a_server_run_call_runs_and_the_model_answers_in_the_same_response(
    tmp_path: Path,
) -> None:
    async with loop_app(tmp_path) as app:
        events = await app.stream(input="ONE-CALL please")
        plain = await app.sdk.responses.create(model=MODEL, input="ONE-CALL please")
    response = final(events)
    assert response["status"] == "completed"
    assert types_of(response) == ["reasoning", "mcp_call", "reasoning", "message"]
    mcp = response["output"][1]
    assert (mcp["name"], mcp["server_label"], mcp["status"]) == ("echo", "testtools", "completed")
    assert json.loads(mcp["arguments"]) == {"text": "hi"} and mcp["output"] == "echo: hi"
    assert response["output"][3]["content"][0]["text"] == "The tool said hi."
    # The call's events, in OpenAI's order: added, argument deltas, arguments done, in
    # progress, completed, done; the answer's items after it.
    kinds = [e["type"] for e in events if e.get("output_index") == 1]
    assert kinds[0] == "response.output_item.added"
    assert "response.mcp_call_arguments.delta" in kinds
    tail = [k for k in kinds if k != "response.mcp_call_arguments.delta"][1:]
    assert tail == [
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
        "response.output_item.done",
    ]
    # Non-streaming: the same Response.
    assert [item.type for item in plain.output] == types_of(response)
    assert plain.output[1].output == "echo: hi"  # type: ignore[union-attr]
    call_seen = app.runner.calls[0]
    assert call_seen.spec.kind == "echo" and call_seen.item_id == mcp["id"]
    assert call_seen.request.input_items[0].text == "ONE-CALL please"  # type: ignore[union-attr]


async def test_the_continuation_extends_the_prompt_on_the_same_session(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app:
        events = await app.stream(input="ONE-CALL please", prompt_cache_key="conv-1")
    first, second = app.engine.requests[-2:]
    # The same routing key and tenant salt: the same engine replica and its cached prefix.
    assert (second.session_id, second.cache_salt) == (first.session_id, first.cache_salt)
    completion = app.engine.outputs[-2]
    head = [*first.prompt_token_ids, *completion]
    assert second.prompt_token_ids[: len(head)] == head
    tail = decode(second.prompt_token_ids[len(head) :])
    assert tail == (
        "<|start|>testtools.echo<|channel|>commentary to=assistant<|message|>echo: hi<|end|>"
        "<|start|>assistant"
    )
    # Usage sums both completions: each one's prompt as input (as OpenAI counts a response
    # of several model calls), the second's prefix found cached.
    usage = final(events)["usage"]
    assert usage["input_tokens"] == len(first.prompt_token_ids) + len(second.prompt_token_ids)
    assert usage["output_tokens"] == sum(len(tokens) for tokens in app.engine.outputs[-2:])
    assert usage["input_tokens_details"]["cached_tokens"] >= len(first.prompt_token_ids) // 2
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_the_stored_response_holds_every_item_also_when_run_in_the_background(
    tmp_path: Path,
) -> None:
    async with loop_app(tmp_path) as app:
        streamed = final(await app.stream(input="ONE-CALL please", store=True))
        stored = (await app.http.get(f"/v1/responses/{streamed['id']}")).json()
        started = await app.sdk.responses.create(
            model=MODEL, input="ONE-CALL please", background=True, store=True
        )
        for _ in range(200):
            background = (await app.http.get(f"/v1/responses/{started.id}")).json()
            if background["status"] not in ("queued", "in_progress"):
                break
            await asyncio.sleep(0.05)
    assert stored["output"] == streamed["output"]
    assert stored["usage"] == streamed["usage"]
    assert background["status"] == "completed"
    assert types_of(background) == ["reasoning", "mcp_call", "reasoning", "message"]
    assert background["output"][1]["output"] == "echo: hi"


# --- concurrency and order --------------------------------------------------------------------


async def test_two_slow_calls_take_about_one_calls_time(tmp_path: Path) -> None:
    runner = EchoRunner(delays={"slow1": 0.6, "slow2": 0.6})
    async with loop_app(tmp_path, runner) as app:
        events = await app.stream(input="TWO-SLOW")
    assert final(events)["status"] == "completed"
    (_, end1), (start2, _) = sorted(runner.times)
    # Both ran at once: the second began before the first ended (so the two took one call's
    # time; said by the calls' own times, not a wall-clock bound a loaded machine breaks).
    assert start2 < end1


async def test_items_close_in_the_models_order_whatever_order_the_calls_finish(
    tmp_path: Path,
) -> None:
    runner = EchoRunner()
    shuffled = 0
    async with loop_app(tmp_path, runner) as app:
        for seed in range(12):
            delays = random.Random(seed).sample([0.0, 0.005, 0.01, 0.02, 0.04], k=5)
            runner.delays = dict(zip(MANY, delays, strict=True))
            runner.finished.clear()
            events = await app.stream(input="MANY-CALLS")
            response = final(events)
            calls = [item for item in response["output"] if item["type"] == "mcp_call"]
            assert [json.loads(c["arguments"])["text"] for c in calls] == MANY
            assert [c["output"] for c in calls] == [f"echo: {text}" for text in MANY]
            closed = [
                e["output_index"]
                for e in events
                if e["type"] == "response.output_item.done" and e["item"]["type"] == "mcp_call"
            ]
            assert closed == sorted(closed)
            assert response["output"][-1]["content"][0]["text"] == "All five are done."
            # The model reads the outputs in its own order too.
            prompt = decode(app.engine.requests[-1].prompt_token_ids)
            places = [prompt.index(f"echo: {text}<|end|>") for text in MANY]
            assert places == sorted(places)
            shuffled += runner.finished != MANY
    assert shuffled >= 6  # the calls really finished out of order in most runs


# --- failures and ends ----------------------------------------------------------------------


async def test_a_runner_that_raises_is_a_failed_call_the_model_reads(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app:
        broken = final(await app.stream(input="BROKEN"))
        refused = final(await app.stream(input="REFUSED"))
    assert broken["status"] == "completed"
    mcp = broken["output"][0]
    assert mcp["status"] == "failed" and "RuntimeError" in mcp["error"]["message"]
    assert broken["output"][-1]["content"][0]["text"] == "The tool broke."
    assert refused["output"][0]["error"]["message"] == "echo refused: fail"
    assert refused["output"][-1]["content"][0]["text"] == "The tool refused."
    prompt = decode(app.engine.requests[-1].prompt_token_ids)
    assert "<|message|>Error: echo refused: fail<|end|>" in prompt


async def test_a_kind_without_a_runner_is_a_failed_call(tmp_path: Path) -> None:
    register_echo()
    async with loop_app(tmp_path, runners=ToolRunners({}, providers=[EchoProvider()])) as app:
        response = final(await app.stream(input="ONE-CALL please"))
    assert response["status"] == "completed"
    mcp = response["output"][1]
    assert mcp["status"] == "failed"
    assert mcp["error"]["message"] == "The server cannot run testtools.echo now."
    assert response["output"][-1]["type"] == "message"  # the model read it and answered


async def test_max_tool_calls_counts_server_calls_and_the_model_answers(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app:
        events = await app.stream(input="LIMIT", max_tool_calls=2)
    response = final(events)
    assert response["status"] == "completed" and response["max_tool_calls"] == 2
    assert types_of(response) == ["mcp_call", "mcp_call", "message"]
    assert app.runner.started == ["l1", "l2"]  # the third call was never run
    assert response["output"][-1]["content"][0]["text"] == "Two of three ran."
    # The answer after the limit may call nothing more (as OpenAI ignores further calls).
    last = app.engine.requests[-1].constraint
    assert last is not None and last.tool_calls == ()


async def test_tool_choice_required_asks_for_the_first_call_only(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app:
        response = final(await app.stream(input="ONE-CALL please", tool_choice="required"))
    first, second = app.engine.requests
    assert first.constraint is not None and first.constraint.final is None  # must call
    assert second.constraint is None  # may answer
    assert response["status"] == "completed" and types_of(response)[-1] == "message"


async def test_a_result_awaiting_the_client_ends_the_response(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app:
        response = final(await app.stream(input="APPROVE"))
    assert response["status"] == "completed" and types_of(response) == ["mcp_call"]
    assert len(app.engine.requests) == 1  # no continuation


async def test_a_client_call_beside_a_server_call_ends_the_response_after_it_ran(
    tmp_path: Path,
) -> None:
    async with loop_app(tmp_path) as app:
        response = final(await app.stream(input="MIXED", tools=[WEATHER_TOOL]))
    assert types_of(response) == ["mcp_call", "function_call"]
    assert response["output"][0]["output"] == "echo: m1"
    assert response["output"][1]["name"] == "get_weather"
    assert response["status"] == "completed" and len(app.engine.requests) == 1


async def test_the_rounds_are_bounded(tmp_path: Path) -> None:
    async with loop_app(tmp_path, max_rounds=3) as app:
        response = final(await app.stream(input="LOOP"))
    assert len(app.engine.requests) == 3
    assert types_of(response) == ["mcp_call"] * 3 and response["status"] == "completed"


async def test_output_tokens_are_bounded_across_completions(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app:
        await app.stream(input="ONE-CALL please")
        first = len(app.engine.outputs[0])
        response = final(await app.stream(input="ONE-CALL please", max_output_tokens=first + 3))
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert app.engine.requests[-1].sampling.max_tokens == 3
    assert response["usage"]["output_tokens"] <= first + 3


# --- cancellation -----------------------------------------------------------------------------


async def test_a_client_that_goes_away_cancels_the_running_call(tmp_path: Path) -> None:
    runner = EchoRunner(delays={"hang": 30, "hang2": 30})
    async with loop_app(tmp_path, runner) as app, on_uvicorn(app.api) as url:
        async with (
            httpx.AsyncClient(base_url=url, timeout=10) as http,
            http.stream(
                "POST", "/v1/responses", json={"model": MODEL, "input": "HANG", "stream": True}
            ) as answer,
        ):
            async for line in answer.aiter_lines():
                if "response.mcp_call.in_progress" in line:
                    break
            await asyncio.wait_for(runner.wait_started(2), 5)
        # The connection is closed: the running call is cancelled, not left to run 30 s.
        for _ in range(100):
            if len(runner.cancelled) == 2:
                break
            await asyncio.sleep(0.05)
    assert sorted(runner.cancelled) == ["hang", "hang2"] and runner.finished == []


async def test_cancelling_the_response_cancels_its_calls(tmp_path: Path) -> None:
    """Many cancellation points: each cancels the running call, never leaves it running."""
    for delay in (0.0, 0.01, 0.03, 0.06):
        runner = EchoRunner(delays={"hang": 30, "hang2": 30})
        async with loop_app(tmp_path / f"d{delay}", runner) as app:
            service = app.api.state.service
            turn = await service.prepare(
                Ask(ResponsesRequest.model_validate({"model": MODEL, "input": "HANG"}))
            )

            async def drain(turn: Any = turn, service: Any = service) -> None:
                async for _ in service.event_batches(turn):
                    pass

            consumer = asyncio.create_task(drain())
            await asyncio.wait_for(runner.wait_started(2), 5)
            await asyncio.sleep(delay)
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
            await asyncio.sleep(0)
            assert sorted(runner.cancelled) == ["hang", "hang2"], delay
            assert runner.finished == []


async def test_cancelling_a_background_response_cancels_its_calls(tmp_path: Path) -> None:
    runner = EchoRunner(delays={"hang": 30, "hang2": 30})
    async with loop_app(tmp_path, runner) as app:
        started = await app.sdk.responses.create(
            model=MODEL, input="HANG", background=True, store=True
        )
        await asyncio.wait_for(runner.wait_started(2), 5)
        cancelled = await app.sdk.responses.cancel(started.id)
        for _ in range(100):
            if len(runner.cancelled) == 2:
                break
            await asyncio.sleep(0.05)
        stored = (await app.http.get(f"/v1/responses/{started.id}")).json()
    assert cancelled.status == "cancelled"
    assert sorted(runner.cancelled) == ["hang", "hang2"] and runner.finished == []
    # The calls it cut short are in its output, never run.
    assert stored["status"] == "cancelled"
    assert [(item["type"], item["status"]) for item in stored["output"][1:]] == [
        ("mcp_call", "incomplete")
    ] * 2


async def test_steering_ends_the_response_between_completions(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app:
        service = app.api.state.service
        request = ResponsesRequest.model_validate({"model": MODEL, "input": "ONE-CALL please"})
        turn = await service.prepare(Ask(request))
        turn.end_at_boundary = lambda: bool(app.runner.finished)
        events = [e async for e in service.events(turn)]
    response = events[-1].response
    assert response.status == "incomplete" and response.incomplete_details.reason == "steered"
    assert [item.type for item in response.output] == ["reasoning", "mcp_call"]
    assert len(app.engine.requests) == 1


# --- websocket ------------------------------------------------------------------------------


async def test_the_loop_streams_over_a_websocket(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app, on_uvicorn(app.api) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
        async with client.responses.connect() as connection:
            await connection.response.create(model=MODEL, input="ONE-CALL please")
            events = []
            while not events or events[-1].type not in TERMINAL:
                events.append(await asyncio.wait_for(connection.recv(), 30))
    check_stream([event.model_dump(exclude_none=True, exclude={"stream_id"}) for event in events])
    assert [item.type for item in events[-1].response.output] == [
        "reasoning",
        "mcp_call",
        "reasoning",
        "message",
    ]


# --- what the model is given of a tool's output ------------------------------------------------

WORDS = "The quick brown fox jumps over the lazy dog, again and again. "


@dataclass
class BigRunner(EchoRunner):
    """``big*`` answers ``outputs[text]`` (an output, or an error with ``error: ``)."""

    outputs: dict[str, str] = field(default_factory=dict)

    async def run(self, call: ToolCall) -> ToolResult:
        text = str(json.loads(call.arguments or "{}").get("text", ""))
        answer = self.outputs.get(text)
        if answer is None:
            return await super().run(call)
        self.calls.append(call)
        if answer.startswith("error: "):
            return ToolResult(error=answer.removeprefix("error: "))
        return ToolResult(output=answer)


def tools_args(**tools: Any) -> AppArgs:
    return AppArgs.model_validate({"tools": tools})


def tool_message(app: LoopApp) -> str:
    """The tool's message the continuation's prompt ends with."""
    first, second = app.engine.requests[-2:]
    head = len(first.prompt_token_ids) + len(app.engine.outputs[-2])
    return decode(second.prompt_token_ids[head:])


async def test_an_output_over_the_token_bound_fails_and_the_model_reads_why(
    tmp_path: Path,
) -> None:
    runner = BigRunner(outputs={"big": WORDS * 200})  # ~2,600 tokens
    async with loop_app(tmp_path, runner, args=tools_args(max_output_tokens=1000)) as app:
        response = final(await app.stream(input="BIG-ONE"))
    call_item = response["output"][0]
    assert call_item["status"] == "failed" and call_item["output"] is None
    assert "more than the 1,000" in call_item["error"]["message"]
    message = tool_message(app)
    assert "not passed on" in message and "quick brown fox" not in message
    first, second = app.engine.requests[-2:]
    assert len(second.prompt_token_ids) < len(first.prompt_token_ids) + 300
    assert response["output"][-1]["content"][0]["text"] == "It was too large."


async def test_an_error_result_is_held_to_the_same_bound(tmp_path: Path) -> None:
    runner = BigRunner(outputs={"big": "error: " + WORDS * 200})
    async with loop_app(tmp_path, runner, args=tools_args(max_output_tokens=1000)) as app:
        response = final(await app.stream(input="BIG-ONE"))
    call_item = response["output"][0]
    assert call_item["status"] == "failed"
    assert "quick brown fox" not in json.dumps(call_item)
    assert "quick brown fox" not in tool_message(app)


async def test_an_output_of_one_huge_piece_fails_before_anything_tokenizes_it(
    tmp_path: Path,
) -> None:
    """700 KB of one letter: ~3 minutes of the tokenizer's CPU before (holding the event loop);
    refused by its length alone now, in milliseconds."""
    runner = BigRunner(outputs={"big": "a" * 700_000})
    async with loop_app(tmp_path, runner) as app:
        before = time.thread_time()
        response = final(await app.stream(input="BIG-ONE"))
        loop_cpu = time.thread_time() - before
    # The event loop's CPU time (other processes do not change it): 184 s before.
    assert loop_cpu < 2, loop_cpu
    call_item = response["output"][0]
    assert call_item["status"] == "failed"
    assert "700,000 characters" in call_item["error"]["message"]
    assert "aaaa" not in tool_message(app)


def test_the_shipped_bound_fits_gpt_oss_context_with_room_to_answer() -> None:
    args = AppArgs()
    tools = args.tools
    assert args.max_context_tokens == 131072
    room = args.max_context_tokens - tools.max_output_tokens - tools.output_reserve_tokens
    assert tools.max_output_tokens <= 32768 and tools.output_reserve_tokens >= 4096
    assert room >= args.max_context_tokens // 2  # the prompt before it, and the answer


async def test_the_bound_is_never_more_than_the_context_leaves(tmp_path: Path) -> None:
    """Two calls share what the context has left, less the reserve for the model's answer."""
    outputs = {"big1": WORDS * 40, "big2": WORDS * 40}  # ~520 tokens each
    args = AppArgs.model_validate(
        {"max_context_tokens": 4096, "tools": {"max_output_tokens": 100_000}}
    )
    async with loop_app(tmp_path, BigRunner(outputs=outputs), args=args) as app:
        response = final(await app.stream(input="BIG-TWO", max_output_tokens=1000))
        prompt = len(app.engine.requests[0].prompt_token_ids)
        completion = len(app.engine.outputs[0])
    left = (4096 - prompt - completion - args.tools.output_reserve_tokens) // 2
    calls = response["output"][:2]
    assert left < 520
    assert [item["status"] for item in calls] == ["failed", "failed"]
    assert all("the context has left" in item["error"]["message"] for item in calls)


async def test_large_tool_messages_render_off_the_event_loop(tmp_path: Path) -> None:
    """Two 900 KB outputs: counted and rendered in the render pool's workers, not on the
    ingress's event loop (which went 1.1 s without a turn before). Judged by the CPU time of
    the event loop's thread, which other processes on a loaded machine do not change (a wall
    clock bound failed at a load average of 40): the whole response costs it about 0.02 s;
    with the outputs' prefixes tokenized on it, 0.14 s; whole, 0.9 s."""
    big = (WORDS * 15_000)[:900_000]
    runner = BigRunner(outputs={"big1": big, "big2": big})
    async with loop_app(tmp_path, runner) as app:
        app.api.state.service.warm()  # as an ingress replica starts its render workers
        await app.stream(input="ONE-CALL warm " + "word " * 1000)  # rendered in a worker
        before = time.thread_time()
        response = final(await app.stream(input="BIG-TWO"))
        loop_cpu = time.thread_time() - before
    assert [item["status"] for item in response["output"][:2]] == ["failed", "failed"]
    assert loop_cpu < 0.07, loop_cpu


# --- calls of tools the request does not have ---------------------------------------------------


async def unknown_count(app: LoopApp) -> float:
    """``serve_app_unknown_tool_calls_total``, from the app's own /metrics."""
    page = (await app.http.get("/metrics")).text
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "serve_app_unknown_tool_calls_total":
                return sample.value
    return 0.0


async def test_an_unknown_call_is_answered_in_the_response_and_never_shown(
    tmp_path: Path,
) -> None:
    """gpt-oss calls ``repo_browser.search`` (no tool of the request, which has only a client
    function and no tool the server runs): no item for it; the server answers as that
    recipient, the model reads why and answers, in the same response."""
    async with loop_app(tmp_path, runners=ToolRunners()) as app:
        before = await unknown_count(app)
        events = await app.stream(input="UNKNOWN-ONE", tools=[WEATHER_TOOL])
        message = tool_message(app)
        plain = await app.sdk.responses.create(
            model=MODEL,
            input="UNKNOWN-ONE",
            tools=[WEATHER_TOOL],
        )
        counted = await unknown_count(app) - before
    response = final(events)
    assert response["status"] == "completed"
    assert types_of(response) == ["reasoning", "message"]
    assert response["output"][-1]["content"][0]["text"] == "No repo browser here."
    assert "repo_browser" not in json.dumps(events)  # no event names it
    # (On analysis, harmony writes the answer's recipient in the role header, as for the
    # browser's answers: the same rendering, tool_messages.py.)
    assert message == (
        "<|start|>repo_browser.search to=assistant<|channel|>analysis<|message|>"
        'Error: No tool named "repo_browser.search" is available. '
        "Available tools: functions.get_weather.<|end|><|start|>assistant"
    )
    # The call stays in the continuation's prompt, before its answer.
    first, second = app.engine.requests[-4:-2]
    head = [*first.prompt_token_ids, *app.engine.outputs[-4]]
    assert second.prompt_token_ids[: len(head)] == head
    assert "to=repo_browser.search code<|message|>" in decode(app.engine.outputs[-4])
    # Non-streaming: the same.
    assert [item.type for item in plain.output] == ["reasoning", "message"]
    assert plain.output_text == "No repo browser here."
    assert counted == 2


async def test_unknown_calls_again_and_again_are_held_to_the_rounds_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A model that calls an undeclared function after every answer ends as a loop at its
    rounds' bound ends: ``completed``, after the last round. Each call is logged with the
    response and the recipient, never its arguments."""
    with caplog.at_level(logging.INFO, logger="serve_app.serving.tools.unknown"):
        async with loop_app(tmp_path, max_rounds=3) as app:
            response = final(await app.stream(input="UNKNOWN-REPEAT"))
    assert len(app.engine.requests) == 3
    assert response["status"] == "completed" and response["output"] == []
    lines = [r.getMessage() for r in caplog.records if r.name == "serve_app.serving.tools.unknown"]
    assert len(lines) == 3
    assert all(response["id"] in line and "functions.nowhere" in line for line in lines)
    assert not any("ARGS-NEVER-LOGGED" in line for line in lines)


async def test_unknown_answers_take_the_models_place_among_server_calls(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app:
        response = final(await app.stream(input="UNKNOWN-BESIDE"))
    assert types_of(response) == ["mcp_call", "mcp_call", "message"]
    assert [item["output"] for item in response["output"][:2]] == ["echo: u1", "echo: u2"]
    message = tool_message(app)
    places = [message.index(text) for text in ("echo: u1", '"functions.gone"', "echo: u2")]
    assert places == sorted(places)
    assert "<|start|>functions.gone<|channel|>commentary to=assistant" in message
    assert "Available tools: testtools.echo." in message


async def test_unknown_calls_count_toward_the_servers_calls_per_response(tmp_path: Path) -> None:
    args = tools_args(max_calls_per_response=1)
    async with loop_app(tmp_path, args=args) as app:
        response = final(await app.stream(input="UNKNOWN-TWO"))
    assert types_of(response) == ["message"]
    assert response["output"][0]["content"][0]["text"] == "The second was not run."
    message = tool_message(app)
    assert 'No tool named "functions.one"' in message
    assert "<|start|>functions.two<|channel|>commentary to=assistant<|message|>Error: Not run" in (
        message
    )
    last = app.engine.requests[-1].constraint
    assert last is not None and last.tool_calls == ()  # no call after the bound


async def test_an_unknown_call_beside_a_client_call_ends_with_the_client_call_alone(
    tmp_path: Path,
) -> None:
    """One completion calls an undeclared function, then the client's: the response ends
    awaiting the client's output, as any client call ends it, showing that call alone; the
    unknown call is counted, never shown, and the client's output chains on as usual."""
    async with loop_app(tmp_path, runners=ToolRunners()) as app:
        before = await unknown_count(app)
        first = final(await app.stream(input="UNKNOWN-WITH-CLIENT", tools=[WEATHER_TOOL]))
        counted = await unknown_count(app) - before
        (called,) = first["output"]
        output = {"type": "function_call_output", "call_id": called["call_id"], "output": "Sunny"}
        second = final(
            await app.stream(input=[output], previous_response_id=first["id"], tools=[WEATHER_TOOL])
        )
    assert first["status"] == "completed" and called["type"] == "function_call"
    assert called["name"] == "get_weather" and json.loads(called["arguments"]) == {"city": "Oslo"}
    assert len(app.engine.requests) == 2 and counted == 1
    assert second["status"] == "completed"
    assert second["output"][-1]["content"][0]["text"] == "It is sunny."
    assert "ghost" not in json.dumps(first)
    # The next prompt holds the client's call and its output, not the call never shown.
    prompt = decode(app.engine.requests[-1].prompt_token_ids)
    assert "to=functions.get_weather" in prompt and "Sunny" in prompt
    assert "ghost" not in prompt


async def test_an_unknown_call_counts_toward_max_tool_calls(tmp_path: Path) -> None:
    async with loop_app(tmp_path) as app:
        response = final(await app.stream(input="UNKNOWN-FIRST", max_tool_calls=1))
    assert types_of(response) == ["message"]
    assert response["output"][0]["content"][0]["text"] == "Answered after the limit."
    assert app.runner.started == []  # the call after it was past the limit: never run
    last = app.engine.requests[-1].constraint
    assert last is not None and last.tool_calls == ()
