"""The simulated engine honours `GenerateRequest.constraint` (issue 20): unscripted, what must
be JSON or a tool call is sampled under the grammar's mask, valid by construction; a scripted
turn that breaks the request's constraint is an engine error, never invalid output.

The sweeps drive the real `SimulatedEngine` in-process (no Ray) with the constraint the
ingress builds; the SDK tests go through the whole in-process app.
"""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
from openai import BadRequestError, InternalServerError

from serve_app.engines.base import GenerateRequest, SamplingSettings
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.encoding import CALL_TOKEN, RETURN_TOKEN
from serve_app.harmony.render import render_request
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import initial_response, new_response_id
from serve_app.serving.turn.engine_request import _constraint
from tests.support import MODEL
from tests.support.client_schemas import MODELS, SCHEMAS, Priority, Route, Ticket
from tests.support.helpers import in_process_api, sdk_client

MAX_TOKENS = 1500
# Fast enough that the time model never sleeps: the sweeps cost the sampling only.
FAST = SimulatedEngineConfig(decode_tokens_per_s=10_000_000, prefill_tokens_per_s=10_000_000)


SEEDS_PER_SCHEMA = 40  # 5 schemas x 40 = 200 final answers, plus the tool-choice sweeps


def _text_format(name: str) -> dict[str, Any]:
    return {
        "format": {"type": "json_schema", "name": name, "strict": True, "schema": SCHEMAS[name]}
    }


def _tools() -> list[dict[str, Any]]:
    strict = [
        {"type": "function", "name": f"save_{name}", "strict": True, "parameters": SCHEMAS[name]}
        for name in ("person", "order", "ticket")
    ]
    # Not strict: its arguments are free (a call to it may carry anything).
    loose = {"type": "function", "name": "note", "strict": False, "parameters": {"type": "object"}}
    return [*strict, loose]


def _request(seed: int, **fields: Any) -> ResponsesRequest:
    # The prompt differs per seed, and the engine seeds its sampler with the prompt.
    body = {"model": MODEL, "input": f"Task number {seed}.", **fields}
    return ResponsesRequest.model_validate(body)


# --- the engine, driven as the ingress drives it --------------------------------------------


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[SimulatedEngine]:
    engine = SimulatedEngine(FAST)
    await engine.start()
    yield engine
    await engine.shutdown()


async def _generate(engine: SimulatedEngine, request: ResponsesRequest) -> list[Any]:
    """The output items a client gets for ``request`` from ``engine``."""
    prompt = render_request(request)
    generate = GenerateRequest(
        request_id=new_response_id(),
        prompt_token_ids=prompt.token_ids,
        sampling=SamplingSettings(max_tokens=MAX_TOKENS, stop_token_ids=(RETURN_TOKEN, CALL_TOKEN)),
        constraint=_constraint(request, prompt.tools),
    )
    tokens: list[int] = []
    finish = None
    async for chunk in engine.generate(generate):
        tokens += chunk.token_ids
        finish = chunk.finish_reason
    assert finish == "stop", f"finished with {finish} after {len(tokens)} tokens"
    response = initial_response(request, response_id=generate.request_id, model=MODEL)
    translator = ResponseStreamTranslator(response, ToolRegistry.from_request(request))
    translator.start()
    translator.feed(tokens)
    assert translator.finish("stop", prompt_tokens=1, cached_tokens=0)[-1].type == (
        "response.completed"
    )
    return list(translator.response.output)


def _validate(text: str, schema: dict[str, Any]) -> None:
    jsonschema.validate(json.loads(text), schema)


# --- which requests carry a constraint ------------------------------------------------------


def test_ordinary_requests_carry_no_constraint() -> None:
    def constraint(**fields: Any) -> Any:
        request = _request(0, **fields)
        return _constraint(request, ToolRegistry.from_request(request))

    loose = [_tools()[-1]]
    assert constraint() is None
    assert constraint(tools=loose) is None  # Codex's strict: false tools, tool_choice auto
    assert constraint(tool_choice="none") is None  # nothing to forbid
    not_strict = {"format": {**_text_format("person")["format"], "strict": False}}
    assert constraint(text=not_strict) is None
    assert constraint(text=_text_format("person")) is not None
    assert constraint(tools=loose, tool_choice="required") is not None
    assert constraint(tools=loose, tool_choice="none") is not None
    assert constraint(tools=_tools()) is not None  # strict tools under auto


# --- sampling under the mask: valid by construction -----------------------------------------


@pytest.mark.parametrize("name", sorted(SCHEMAS))
async def test_final_answers_validate(engine: SimulatedEngine, name: str) -> None:
    """With strict tools on offer under auto, the engine answers (it never calls a tool on its
    own), and the answer validates against the format's schema."""
    for seed in range(SEEDS_PER_SCHEMA):
        request = _request(seed, text=_text_format(name), tools=_tools())
        items = await _generate(engine, request)
        assert [item.type for item in items[:-1]] == ["reasoning"] * (len(items) - 1)
        assert items[-1].type == "message", f"seed {seed}"
        text = items[-1].content[0].text
        _validate(text, SCHEMAS[name])
        MODELS[name].model_validate_json(text)
        # Keys in the schema's order, as OpenAI's strict mode writes them.
        assert list(json.loads(text)) == list(SCHEMAS[name]["properties"])


async def test_required_always_calls_and_strict_arguments_validate(
    engine: SimulatedEngine,
) -> None:
    called = set()
    for seed in range(40):
        items = await _generate(engine, _request(seed, tools=_tools(), tool_choice="required"))
        call = items[-1]
        assert call.type == "function_call", f"seed {seed}"
        assert not [item for item in items if item.type == "message"]
        called.add(call.name)
        if call.name.startswith("save_"):
            _validate(call.arguments, SCHEMAS[call.name.removeprefix("save_")])
    assert called == {"save_person", "save_order", "save_ticket", "note"}


async def test_named_tool_choice_always_calls_that_tool(engine: SimulatedEngine) -> None:
    for seed in range(25):
        choice = {"type": "function", "name": "save_order"}
        items = await _generate(engine, _request(seed, tools=_tools(), tool_choice=choice))
        assert (items[-1].type, items[-1].name) == ("function_call", "save_order"), f"seed {seed}"
        _validate(items[-1].arguments, SCHEMAS["order"])


async def test_tool_choice_none_never_calls(engine: SimulatedEngine) -> None:
    for seed in range(25):
        request = _request(seed, tools=_tools(), tool_choice="none", text=_text_format("ticket"))
        items = await _generate(engine, request)
        assert all(item.type in ("reasoning", "message") for item in items), f"seed {seed}"
        _validate(items[-1].content[0].text, SCHEMAS["ticket"])


async def test_free_answer_allowed_keeps_the_default_answer(engine: SimulatedEngine) -> None:
    """Strict tools under auto, no format: the placeholder obeys, and stays what it was."""
    items = await _generate(engine, _request(0, tools=_tools()))
    assert items[-1].type == "message"
    assert items[-1].content[0].text.startswith("Placeholder answer from serve_app's simulated")


async def test_sampling_is_seeded(engine: SimulatedEngine) -> None:
    request = _request(7, text=_text_format("order"))
    first, second = await _generate(engine, request), await _generate(engine, request)
    assert first[-1].content[0].text == second[-1].content[0].text


# --- the SDKs against the unscripted engine, through the whole app --------------------------


async def test_openai_sdk_responses_parse(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "parse.db") as api:
        client = sdk_client(api)
        for run in range(10):
            response = await client.responses.parse(
                model=MODEL, input=f"Route number {run}.", text_format=Route
            )
            assert isinstance(response.output_parsed, Route), run


async def test_agents_sdk_output_type(tmp_path: Path) -> None:
    set_tracing_disabled(True)  # no trace upload: nothing leaves this machine
    async with in_process_api(tmp_path / "agents.db") as api:
        agent = Agent(
            name="ticketer",
            instructions="File the ticket.",
            model=OpenAIResponsesModel(model=MODEL, openai_client=sdk_client(api)),
            output_type=Ticket,
        )
        for run in range(5):
            result = await Runner.run(agent, f"Ticket number {run}: the printer is on fire.")
            assert isinstance(result.final_output, Ticket), run


# --- scripted turns are checked against the constraint --------------------------------------

SCRIPT = {
    "turns": [
        {"match": "BREAK-FORMAT", "items": [{"text": "Sure! Here is your ticket."}]},
        {
            "match": "OBEY-FORMAT",
            "items": [
                {"reasoning": "A ticket."},
                {"text": '{"priority": "high", "status": "open", "escalated": false}'},
            ],
        },
        {
            "match": "BAD-ARGUMENTS",
            "items": [{"function_call": {"name": "save_ticket", "arguments": {"priority": "x"}}}],
        },
        {
            "match": "TWO-CALLS",
            "items": [
                {"function_call": {"name": "note", "arguments": {"a": 1}}},
                {"function_call": {"name": "note", "arguments": {"b": 2}}},
            ],
        },
    ]
}
SCRIPTED = FAST.model_copy(update={"script": SCRIPT})
BROKEN = "breaks the request's constraint"


async def test_a_script_breaking_the_constraint_fails_the_request(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "script.db", engine=SCRIPTED) as api:
        client = sdk_client(api)
        with pytest.raises(InternalServerError, match=BROKEN):
            await client.responses.parse(model=MODEL, input="BREAK-FORMAT", text_format=Ticket)
        tool = _tools()[2]
        with pytest.raises(InternalServerError, match=BROKEN):
            await client.responses.create(
                model=MODEL, input="BAD-ARGUMENTS", tools=[tool], tool_choice="required"
            )
        # Streaming: the stream ends in response.failed with the same message.
        stream = await client.responses.create(
            model=MODEL, input="BREAK-FORMAT", text=_text_format("ticket"), stream=True
        )
        events = [event async for event in stream]
        assert events[-1].type == "response.failed"
        assert BROKEN in events[-1].response.error.message


async def test_a_script_obeying_the_constraint_plays(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "script.db", engine=SCRIPTED) as api:
        client = sdk_client(api)
        parsed = await client.responses.parse(model=MODEL, input="OBEY-FORMAT", text_format=Ticket)
        expected = Ticket(priority=Priority.HIGH, status="open", escalated=False)
        assert parsed.output_parsed == expected
        # Each call of a turn is checked as its own completion (json.dumps spacing allowed).
        response = await client.responses.create(
            model=MODEL, input="TWO-CALLS", tools=[_tools()[-1]], tool_choice="required"
        )
        assert [item.type for item in response.output] == ["function_call", "function_call"]


async def test_the_vocabulary_loads_off_the_event_loop(
    engine: SimulatedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the llguidance vocabulary takes about a second: never in the event loop."""
    from serve_app.engines.simulated import constrained as simulated

    threads: list[threading.Thread] = []
    monkeypatch.setattr(simulated, "_VOCABULARY_LOADED", False)
    monkeypatch.setattr(
        simulated, "harmony_tokenizer", lambda: threads.append(threading.current_thread())
    )
    await _generate(engine, _request(1, text=_text_format("ticket")))
    await _generate(engine, _request(2, text=_text_format("ticket")))
    assert len(threads) == 1 and threads[0] is not threading.main_thread()


async def test_a_schema_llguidance_rejects_is_the_clients_error(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}},  # look-behind
        "required": ["a"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "lb", "strict": True, "schema": schema}}
    async with in_process_api(tmp_path / "reject.db") as api:
        with pytest.raises(BadRequestError, match="cannot enforce") as raised:
            await sdk_client(api).responses.create(model=MODEL, input="hi", text=text)
    # Refused at the ingress, before the engine, naming the param.
    assert raised.value.body["param"] == "text.format.schema"  # type: ignore[index]


def test_the_constraint_crosses_ray() -> None:
    """GenerateRequest goes to the engine replica pickled: the constraint survives that."""
    request = _request(0, text=_text_format("route"), tools=_tools(), tool_choice="required")
    prompt = render_request(request)
    generate = GenerateRequest(
        request_id="r",
        prompt_token_ids=prompt.token_ids,
        sampling=SamplingSettings(max_tokens=8),
        constraint=_constraint(request, prompt.tools),
    )
    assert generate.constraint is not None
    assert pickle.loads(pickle.dumps(generate)) == generate
