"""A request's ``moderation``, end to end in this process (serve_app/serving/moderation.py):
the simulated engine plays gpt-oss-safeguard with tests/fixtures/moderation_script.yaml (a
marker in the judged content picks its answer), the main engine plays inline turns. Every body
and event is validated by the openai SDK's types, as sent on the wire."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from serve_app.config import AppArgs, EngineConfig, ModerationArgs
from serve_app.engines.base import GenerateChunk, GenerateRequest
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.serving.engine.client import InProcessEngineClient
from tests.support import MODEL, MODERATION_SCRIPT
from tests.support.helpers import in_process_api, on_uvicorn, sdk_client
from tests.support.traffic import sse_events
from tests.support.websocket import connected, until_terminal

RESPONSE: TypeAdapter[Any] = TypeAdapter(Response)
EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)
CLASSIFIER = "gpt-oss-safeguard-20b"
WINDOW = 32
# A long answer with a violent passage in its middle and a sentinel at its end: a flagged
# window under `block` stops the stream before the sentinel.
LONG = " ".join(f"word{i}" for i in range(60))
VIOLENT_ANSWER = f"{LONG} MOD-VIOLENT I will hurt him. {LONG} {LONG} {LONG} TAIL-SENTINEL"
MAIN_TURNS = {
    "turns": [
        {"match": "TELL-VIOLENT", "items": [{"text": VIOLENT_ANSWER}]},
        {"match": "TELL-WORDY", "items": [{"text": f"{LONG} MOD-WORDY"}]},
        {"items": [{"reasoning": "Easy."}, {"text": "Hello there, happy to help."}]},
    ]
}


def moderated(**overrides: Any) -> AppArgs:
    options = {"script": str(MODERATION_SCRIPT), "decode_tokens_per_s": 50_000}
    return AppArgs(
        moderation=ModerationArgs(
            engine=EngineConfig(options=options), output_window_tokens=WINDOW, **overrides
        )
    )


def main_engine(**overrides: Any) -> SimulatedEngineConfig:
    return SimulatedEngineConfig(script=MAIN_TURNS, **{"decode_tokens_per_s": 50_000, **overrides})


def body(text: str, input_mode: str = "score", output_mode: str = "score", **more: Any) -> dict:
    policy = {"input": {"mode": input_mode}, "output": {"mode": output_mode}}
    return {
        "model": MODEL,
        "input": text,
        "moderation": {"model": CLASSIFIER, "policy": policy},
        **more,
    }


def http(api: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api), base_url="http://app", timeout=30
    )


async def create(api: FastAPI, payload: dict) -> dict:
    """A non-streamed response, as sent, validated as the SDK's Response."""
    async with http(api) as client:
        answer = await client.post("/v1/responses", json=payload)
    assert answer.status_code == 200, answer.text
    RESPONSE.validate_python(answer.json())
    return answer.json()


async def stream(api: FastAPI, payload: dict) -> list[dict]:
    """A streamed response's events, as sent, each validated as the SDK's event."""
    async with http(api) as client:
        answer = await client.post("/v1/responses", json={**payload, "stream": True})
    assert answer.status_code == 200, answer.text
    events = list(sse_events(answer.text))
    for event in events:
        EVENT.validate_python(event)
    return events


def output_text(response: dict) -> str:
    return "".join(
        part.get("text", "")
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


# --- results ---------------------------------------------------------------------------------


async def test_scores_both_sides_on_the_response(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        response = await create(api, body("Say hello."))
        typed = await sdk_client(api).responses.create(
            model=MODEL, input="Say hello.", moderation={"model": CLASSIFIER}
        )
    assert response["status"] == "completed"
    assert output_text(response) == "Hello there, happy to help."
    for side in ("input", "output"):
        result = response["moderation"][side]
        assert result["type"] == "moderation_result" and result["model"] == CLASSIFIER
        assert result["flagged"] is False
        assert set(result["categories"]) == set(result["category_scores"])
        assert len(result["categories"]) == 13  # the shipped policy's, OpenAI's names
        assert result["category_applied_input_types"]["violence"] == ["text"]
    assert response["moderation"]["input"]["category_scores"]["violence"] == 0.02
    # Through the Python SDK, typed.
    assert typed.moderation is not None
    assert typed.moderation.input.type == "moderation_result"
    assert typed.moderation.output.type == "moderation_result"


async def test_unmoderated_responses_say_nothing_of_it(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        response = await create(api, {"model": MODEL, "input": "Say hello."})
    assert "moderation" not in response


async def test_the_stream_carries_the_results_on_its_terminal_event(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        events = await stream(api, body("Say hello."))
    assert events[0]["type"] == "response.created"
    assert events[0]["response"]["moderation"] is None  # judged later
    assert events[-1]["type"] == "response.completed"
    final = events[-1]["response"]["moderation"]
    assert final["input"]["type"] == final["output"]["type"] == "moderation_result"


async def test_the_results_are_stored_with_the_response(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        response = await create(api, body("Say hello."))
        async with http(api) as client:
            stored = (await client.get(f"/v1/responses/{response['id']}")).json()
    assert stored["moderation"] == response["moderation"]


def test_the_python_sdk_streams_and_websockets_moderation(tmp_path: Path) -> None:
    """The openai SDK's own stream helper and its WebSocket mode (``responses.connect``): a
    blocked input, read as the SDK types it (every WebSocket event validated as its server
    event). Sync SDK over real HTTP in a thread; the app on uvicorn in this test's loop."""
    policy = {"input": {"mode": "block"}}
    moderation = {"model": CLASSIFIER, "policy": policy}

    def play(url: str) -> tuple[Any, list[Any]]:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        with client.responses.stream(
            model=MODEL, input="MOD-VIOLENT: I will hurt him.", moderation=moderation
        ) as stream:
            # The helper's get_final_response() takes `response.completed` only: the
            # terminal event says it here.
            streamed = [event for event in stream][-1].response
        with connected(client) as connection:
            connection.response.create(
                model=MODEL, input="MOD-VIOLENT: I will hurt him.", moderation=moderation
            )
            events = until_terminal(connection)
        return streamed, events

    async def serve() -> tuple[Any, list[Any]]:
        async with (
            in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api,
            on_uvicorn(api) as url,
        ):
            return await asyncio.to_thread(play, url)

    streamed, events = asyncio.run(serve())
    for response in (streamed, events[-1].response):
        assert response.status == "incomplete"
        assert response.incomplete_details.reason == "content_filter"
        assert response.output == []
        assert response.moderation.input.type == "moderation_result"
        assert response.moderation.input.flagged
    for event in events:
        SERVER_EVENT.validate_python(event.model_dump(mode="json", exclude_unset=True))


# --- score: results only -------------------------------------------------------------------


async def test_a_flagged_input_under_score_is_answered(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        response = await create(api, body("MOD-VIOLENT: I will hurt him."))
    assert response["status"] == "completed" and output_text(response)
    judged = response["moderation"]["input"]
    assert judged["flagged"] is True
    assert judged["categories"]["violence"] is True
    assert judged["categories"]["harassment/threatening"] is True
    assert judged["categories"]["harassment"] is False  # 0.4, under the threshold
    assert judged["category_scores"]["violence"] == 0.93


async def test_a_flagged_output_under_score_is_answered_whole(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        response = await create(api, body("TELL-VIOLENT"))
    assert response["status"] == "completed"
    assert output_text(response) == VIOLENT_ANSWER
    assert response["moderation"]["input"]["flagged"] is False
    assert response["moderation"]["output"]["flagged"] is True
    assert response["moderation"]["output"]["categories"]["violence"] is True


async def test_a_short_output_is_judged_at_its_end(tmp_path: Path) -> None:
    """Less than one window of output text: judged once, when the answer ends."""
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        response = await create(api, body("Say hello."))
        engine = api.state.moderation_engine
    assert response["moderation"]["output"]["category_scores"]["violence"] == 0.02
    assert engine.num_ongoing_requests() == 0


# --- block ---------------------------------------------------------------------------------


async def test_a_flagged_input_under_block_ends_the_response_before_output(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        events = await stream(api, body("MOD-VIOLENT: I will hurt him.", input_mode="block"))
        engine = api.state.engine
    types = [event["type"] for event in events]
    assert types == ["response.created", "response.in_progress", "response.incomplete"]
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "content_filter"}
    assert final["output"] == []
    assert final["moderation"]["input"]["flagged"] is True
    assert engine.num_ongoing_requests() == 0  # the engine request was aborted


async def test_a_passing_input_under_block_is_answered(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        response = await create(api, body("Say hello.", input_mode="block"))
    assert response["status"] == "completed"
    assert output_text(response) == "Hello there, happy to help."


async def test_a_flagged_output_window_under_block_stops_output(tmp_path: Path) -> None:
    # Decoding slowly enough that a window's verdict comes back long before the answer ends.
    engine = main_engine(decode_tokens_per_s=300)
    async with in_process_api(tmp_path / "db", moderated(), engine=engine) as api:
        events = await stream(api, body("TELL-VIOLENT", output_mode="block"))
        main = api.state.engine
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    assert final["incomplete_details"] == {"reason": "content_filter"}
    assert final["moderation"]["output"]["flagged"] is True
    text = output_text(final)
    assert "MOD-VIOLENT" in text and "TAIL-SENTINEL" not in text
    assert final["output"][-1]["status"] == "incomplete"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == text  # the stream and the final Response agree
    assert main.num_ongoing_requests() == 0


async def test_a_flagged_last_window_under_block_ends_content_filter(tmp_path: Path) -> None:
    """Flagged in the window judged as the answer ends: the response is not `completed`."""
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        response = await create(api, body("TELL-WORDY", output_mode="block"))
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "content_filter"}
    assert response["moderation"]["output"]["categories"]["hate"] is True
    assert response["moderation"]["output"]["category_scores"]["hate"] == 0.9


# --- beside the prefill --------------------------------------------------------------------


class Timed:
    """An engine client that notes when each request started and ended."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.started: list[float] = []
        self.ended: list[float] = []

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        self.started.append(time.monotonic())
        try:
            async for chunk in self._inner.stream(request):
                yield chunk
        finally:
            self.ended.append(time.monotonic())

    async def ping(self) -> None: ...

    async def await_routable(self, session_id: str) -> bool:
        return True


async def test_the_input_is_judged_beside_the_prefill(tmp_path: Path) -> None:
    """The engine request starts with the judgement, not after it: under `block`, time to
    first token is the longer of the two (about 0.7 s and 0.8 s here), not their sum. Over
    real HTTP (uvicorn): the in-process transport hands over a body only once it is whole."""
    from serve_app.engines.simulated import SimulatedEngine

    classifier = SimulatedEngine(SimulatedEngineConfig(script=str(MODERATION_SCRIPT)))
    await classifier.start()
    timed = Timed(InProcessEngineClient(classifier))
    slow_prefill = main_engine(prefill_tokens_per_s=100)  # 72 prompt tokens: ~0.7 s
    async with (
        in_process_api(tmp_path / "db", moderated(), engine=slow_prefill, moderation=timed) as api,
        on_uvicorn(api) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        payload = {**body("MOD-PAUSE hello", input_mode="block"), "stream": True}
        sent = time.monotonic()
        first_text = None
        async with client.stream("POST", "/v1/responses", json=payload) as answer:
            async for line in answer.aiter_lines():
                if first_text is None and line.startswith("data:") and ".delta" in line:
                    first_text = time.monotonic() - sent
    judgement = timed.ended[0] - sent
    assert first_text is not None
    assert timed.started[0] - sent < 0.2  # judged from the start
    # Held until the verdict (block), and released with it: not a prefill after it.
    assert judgement <= first_text < judgement + 0.45


# --- failures: an error result, never a failed or hung response ------------------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("MOD-CRASH now", "moderation_failed"),
        ("MOD-GARBLED now", "moderation_unparseable"),
        ("MOD-SLOW now", "moderation_timeout"),
    ],
)
async def test_a_failed_judgement_is_an_error_result(tmp_path: Path, text: str, code: str) -> None:
    args = moderated(timeout_s=0.5)
    async with in_process_api(tmp_path / "db", args, engine=main_engine()) as api:
        started = time.monotonic()
        response = await create(api, body(text, input_mode="block", output_mode="block"))
        elapsed = time.monotonic() - started
        engine = api.state.moderation_engine
        async with http(api) as client:
            scraped = (await client.get("/metrics")).text
    assert response["status"] == "completed"  # an error result does not block
    assert output_text(response) == "Hello there, happy to help."
    assert response["moderation"]["input"]["type"] == "error"
    assert response["moderation"]["input"]["code"] == code
    assert response["moderation"]["input"]["message"]
    assert response["moderation"]["output"]["type"] == "moderation_result"
    assert elapsed < 5
    # Counted for the operator, by side and outcome.
    counted = f'serve_app_moderation_judgements_total{{outcome="{code}",side="input"}}'
    assert counted in scraped
    await asyncio.sleep(0)
    assert engine.num_ongoing_requests() == 0  # a timed-out judgement was aborted


class Broken:
    """A moderation deployment that raises on every call (its replicas died), or never answers."""

    def __init__(self, hang: bool = False) -> None:
        self._hang = hang

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        if self._hang:
            await asyncio.Event().wait()
        raise RuntimeError("ActorDiedError: the moderation replica is gone")
        yield GenerateChunk()  # pragma: no cover - an async generator

    async def ping(self) -> None: ...

    async def await_routable(self, session_id: str) -> bool:
        return True


@pytest.mark.parametrize(
    ("hang", "code"), [(False, "moderation_failed"), (True, "moderation_timeout")]
)
async def test_a_dead_or_silent_deployment_is_an_error_result(
    tmp_path: Path, hang: bool, code: str
) -> None:
    args = moderated(timeout_s=0.3)
    async with in_process_api(
        tmp_path / "db", args, engine=main_engine(), moderation=Broken(hang)
    ) as api:
        events = await stream(api, body("TELL-VIOLENT", input_mode="block", output_mode="block"))
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert final["moderation"]["input"] == {
        "type": "error",
        "code": code,
        "message": final["moderation"]["input"]["message"],
    }
    assert final["moderation"]["output"]["type"] == "error"
    assert output_text(final) == VIOLENT_ANSWER


# --- the door ------------------------------------------------------------------------------


async def _refusal(api: FastAPI, payload: dict) -> dict:
    async with http(api) as client:
        answer = await client.post("/v1/responses", json=payload)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    return error


async def test_moderation_where_the_app_has_none_is_a_400(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", engine=main_engine()) as api:
        error = await _refusal(api, body("hi"))
    assert error["param"] == "moderation"


@pytest.mark.parametrize(
    ("moderation", "param"),
    [
        ({"model": "text-moderation-007"}, "moderation.model"),
        ({"policy": {"input": {"mode": "score"}}}, "moderation.model"),
        (
            {"model": CLASSIFIER, "policy": {"input": {"mode": "warn"}}},
            "moderation.policy.input.mode",
        ),
        ({"model": CLASSIFIER, "policy": {"output": {}}}, "moderation.policy.output.mode"),
        ({"model": CLASSIFIER, "policy": "strict"}, "moderation.policy"),
    ],
)
async def test_bad_moderation_is_a_400_naming_the_param(
    tmp_path: Path, moderation: dict, param: str
) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        error = await _refusal(api, {"model": MODEL, "input": "hi", "moderation": moderation})
    assert error["param"] == param


async def test_openais_default_model_name_is_served_by_the_safeguard(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "db", moderated(), engine=main_engine()) as api:
        payload = {"model": MODEL, "input": "hi", "moderation": {"model": "omni-moderation-latest"}}
        response = await create(api, payload)
    assert response["moderation"]["input"]["model"] == CLASSIFIER  # the model that judged
