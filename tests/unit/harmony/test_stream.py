"""The stream translator: harmony token ids in, Responses events out, as clients accept them.

Every stream here is real harmony token ids from the gpt-oss encoding (well formed or broken
the ways models break it). Each event goes through the SSE encoder, is parsed back from the
wire and validated against the openai SDK's event models and the Open Responses specification
(tests/support/open_responses.py, when it is on this machine), then fed to the SDK's own stream
accumulator, whose final snapshot must equal the translator's Response.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from openai._models import construct_type
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from openai_harmony import StreamableParser
from pydantic import TypeAdapter

from serve_app.engines.base import TokenLogprob
from serve_app.harmony import stream as stream_module
from serve_app.harmony.encoding import CALL_TOKEN, END_TOKEN, RETURN_TOKEN, get_encoding
from serve_app.harmony.items import UnknownCall
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import dump_response, initial_response, new_response_id, usage
from serve_app.protocol.sse import encode_event
from tests.support import MODEL, open_responses

ENCODING = get_encoding()
EVENT = TypeAdapter(ResponseStreamEvent)
TERMINAL_TYPES = {"response.completed", "response.incomplete", "response.failed"}
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hi there\n*** End Patch\n"

REQUEST_BODY: dict[str, Any] = {
    "model": MODEL,
    "input": "do the task",
    "tools": [
        {
            "type": "function",
            "name": "exec_command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
        },
        {"type": "tool_search", "execution": "client"},
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "agents",
            "tools": [{"type": "function", "name": "close_agent"}],
        },
    ],
    "parallel_tool_calls": True,
    "store": False,
    "prompt_cache_key": "thread-1",
    "metadata": {"k": "v"},
    "reasoning": {"effort": "high"},
    "max_output_tokens": 512,
}


@pytest.fixture(autouse=True)
def no_internal_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The translator hides its own bugs from clients (logged, item closed); tests must not."""
    with caplog.at_level(logging.ERROR, logger="serve_app.harmony.stream"):
        yield
    records = caplog.get_records("call")
    problems = [r for r in records if r.name.startswith("serve_app") and r.levelno >= logging.ERROR]
    assert not problems, [r.getMessage() for r in problems]


def tokens(harmony: str) -> list[int]:
    return ENCODING.encode(harmony, allowed_special="all")


def chunked(ids: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Split ``ids`` into chunks whose sizes cycle through ``sizes``."""
    out: list[list[int]] = []
    position, turn = 0, 0
    while position < len(ids):
        size = sizes[turn % len(sizes)]
        out.append(list(ids[position : position + size]))
        position += size
        turn += 1
    return out


def new_translator(
    seal: Callable[[str], str] | None = None,
    body: dict[str, Any] | None = None,
    *,
    summarize: bool = False,
    max_tool_calls: int | None = None,
) -> ResponseStreamTranslator:
    request = ResponsesRequest.model_validate(body or REQUEST_BODY)
    response = initial_response(request, response_id=new_response_id(), model=MODEL)
    return ResponseStreamTranslator(
        response,
        ToolRegistry.from_request(request),
        seal_reasoning=seal,
        summarize_reasoning=summarize,
        max_tool_calls=max_tool_calls,
    )


@dataclass
class Run:
    translator: ResponseStreamTranslator
    wire: list[dict[str, Any]]  # each event's `data:` JSON, as a client reads it
    state: ResponseStreamState  # the openai SDK's accumulator after all events

    @property
    def types(self) -> list[str]:
        return [event["type"] for event in self.wire]

    @property
    def response(self) -> Response:
        return self.translator.response

    @property
    def terminal(self) -> dict[str, Any]:
        return self.wire[-1]

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [event for event in self.wire if event["type"] == event_type]

    def items(self) -> list[dict[str, Any]]:
        return self.terminal["response"]["output"]


def drive(
    ids: Sequence[int],
    finish: str | None = "stop",
    sizes: Sequence[int] = (1,),
    *,
    seal: Callable[[str], str] | None = None,
    fail: tuple[str, str] | None = None,
    prompt_tokens: int = 100,
    cached_tokens: int = 0,
    summarize: bool = False,
    max_tool_calls: int | None = None,
    top_logprobs: int | None = None,
) -> Run:
    """``top_logprobs``: chunks carry `stand_in_logprob` entries with that many alternatives."""
    translator = new_translator(seal, summarize=summarize, max_tool_calls=max_tool_calls)
    events: list[ResponseStreamEvent] = translator.start()
    position = 0
    for chunk in chunked(ids, sizes):
        logprobs = None
        if top_logprobs is not None:
            logprobs = [
                stand_in_logprob(position + offset, token, top_logprobs)
                for offset, token in enumerate(chunk)
            ]
        position += len(chunk)
        events += translator.feed(chunk, logprobs)
    if fail is not None:
        events += translator.fail(*fail)
    else:
        assert finish is not None
        events += translator.finish(
            finish, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens
        )
    wire = [decode_sse(encode_event(event)) for event in events]
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for data in wire:
        # Exactly what a client gets: validated against the SDK's models from the JSON, and
        # against the specification (the fields every Response carries, what is never null).
        state.handle_event(EVENT.validate_python(data))
        if open_responses.available():
            open_responses.check_event(data)
    run = Run(translator, wire, state)
    check_stream(run)
    return run


def stand_in_logprob(position: int, token: int, top: int) -> TokenLogprob:
    """An engine's entry whose value names the token's position: -(position + 1) / 1000."""
    logprob = -(position + 1) / 1000
    alternatives = [(token, logprob)] + [(token + n, logprob - n) for n in range(1, top)]
    return logprob, tuple(alternatives[:top])


def decode_sse(raw: bytes) -> dict[str, Any]:
    text = raw.decode()
    assert text.endswith("\n\n") and text.count("\n\n") == 1
    event_line, data_line = text[:-2].split("\n")
    assert event_line.startswith("event: ") and data_line.startswith("data: ")
    data = json.loads(data_line.removeprefix("data: "))
    assert event_line.removeprefix("event: ") == data["type"]
    return data


# --- invariants every stream must hold -----------------------------------------------------

ITEM_EVENT_ORDER = {
    "message": [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta*",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ],
    "reasoning": [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta*",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ],
    # With a summary asked for: summary part 0 beside the content part, each delta twice.
    "reasoning+summary": [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_text.delta+response.reasoning_summary_text.delta*",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
    ],
    "function_call": [
        "response.output_item.added",
        "response.function_call_arguments.delta*",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ],
    "custom_tool_call": [
        "response.output_item.added",
        "response.custom_tool_call_input.delta*",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ],
}


def order_pattern(kind: str) -> re.Pattern[str]:
    parts = []
    for step in ITEM_EVENT_ORDER[kind]:
        # `a+b*`: the events a then b, repeated.
        name = "".join(re.escape(event + ";") for event in step.rstrip("*").split("+"))
        parts.append(f"(?:{name})*" if step.endswith("*") else name)
    return re.compile("".join(parts))


def check_stream(run: Run) -> None:
    wire = run.wire
    assert [event["sequence_number"] for event in wire] == list(range(len(wire)))
    assert run.types[:2] == ["response.created", "response.in_progress"]
    assert [t for t in run.types if t in TERMINAL_TYPES] == [run.types[-1]]
    assert "response.tool_call.delta" not in run.types and "error" not in run.types
    response_ids = {event["response"]["id"] for event in wire if "response" in event}
    assert response_ids == {run.response.id}

    by_index: dict[int, list[dict[str, Any]]] = defaultdict(list)
    order: list[int] = []
    for event in wire[2:-1]:
        index = event["output_index"]
        if index not in by_index:
            order.append(index)
        by_index[index].append(event)
        assert event.get("content_index", 0) == 0
    # Output indexes count up from 0, one item at a time (items never interleave).
    assert order == list(range(len(order)))
    assert [e["output_index"] for e in wire[2:-1]] == sorted(e["output_index"] for e in wire[2:-1])

    final_output = run.terminal["response"]["output"]
    assert len(final_output) == len(order)
    item_ids = set()
    for index, events in by_index.items():
        added, done = events[0], events[-1]
        kind = added["item"]["type"]
        if kind == "reasoning" and done["item"]["summary"]:
            kind = "reasoning+summary"
        sequence = "".join(event["type"] + ";" for event in events)
        assert order_pattern(kind).fullmatch(sequence), sequence
        item_id = added["item"]["id"]
        assert item_id not in item_ids
        item_ids.add(item_id)
        assert done["item"]["id"] == item_id
        assert all(event.get("item_id", item_id) == item_id for event in events)
        assert done["item"] == final_output[index]
        check_deltas_add_up(events, done["item"])
    check_sdk_agrees(run)


def check_deltas_add_up(events: list[dict[str, Any]], item: dict[str, Any]) -> None:
    check_summary(events, item)
    events = [event for event in events if "reasoning_summary" not in event["type"]]
    streamed = "".join(event["delta"] for event in events if event["type"].endswith(".delta"))
    assert all(event["delta"] for event in events if event["type"].endswith(".delta"))
    assert "\ufffd" not in streamed or "\ufffd" in final_text(item)
    if item["type"] == "function_call" and streamed.strip() == "":
        assert item["arguments"] == "{}"  # a call without arguments
    else:
        assert streamed == final_text(item)
    for event in events:
        if event["type"] in ("response.output_text.done", "response.reasoning_text.done"):
            assert event["text"] == final_text(item)
        if event["type"] == "response.content_part.done":
            assert event["part"]["text"] == final_text(item)


def check_summary(events: list[dict[str, Any]], item: dict[str, Any]) -> None:
    """A summarized reasoning item: one summary_text part, its deltas adding up to it."""
    summary_events = [event for event in events if "reasoning_summary" in event["type"]]
    if item["type"] != "reasoning" or not item["summary"]:
        assert not summary_events
        return
    (part,) = item["summary"]
    assert part["type"] == "summary_text"
    assert all(event["summary_index"] == 0 for event in summary_events)
    by_type = {event["type"]: event for event in summary_events}
    assert by_type["response.reasoning_summary_part.added"]["part"] == {
        "type": "summary_text",
        "text": "",
    }
    deltas = [e["delta"] for e in summary_events if e["type"].endswith(".delta")]
    assert all(deltas) and "".join(deltas) == part["text"]
    assert by_type["response.reasoning_summary_text.done"]["text"] == part["text"]
    assert by_type["response.reasoning_summary_part.done"]["part"] == part


def final_text(item: dict[str, Any]) -> str:
    if item["type"] in ("message", "reasoning"):
        return "".join(part["text"] for part in item["content"])
    return item["arguments"] if item["type"] == "function_call" else item["input"]


def sdk_dump(model: Any) -> Any:
    """A model as JSON, without the SDK's parse-only additions."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: strip(inner)
                for key, inner in value.items()
                if key not in ("parsed", "parsed_arguments")
            }
        if isinstance(value, list):
            return [strip(inner) for inner in value]
        return value

    return strip(model.model_dump(mode="json", by_alias=True, exclude_unset=True))


def check_sdk_agrees(run: Run) -> None:
    state = run.state
    ours = sdk_dump(run.response)
    if run.terminal["type"] == "response.completed":
        completed = state._completed_response
        assert completed is not None
        assert sdk_dump(completed) == ours
    # Items the SDK finished from output_item.done events are ours, in order.
    completed_output = [state._completed_output[i] for i in sorted(state._completed_output)]
    assert [sdk_dump(item) for item in completed_output] == ours["output"]
    # Its delta-built snapshot holds the same text and arguments.
    snapshot = state._ResponseStreamState__current_snapshot  # type: ignore[attr-defined]
    for streamed, final in zip(snapshot.output, run.response.output, strict=True):
        if final.type == "message":
            assert [part.text for part in streamed.content] == [p.text for p in final.content]
        if final.type == "function_call" and final.arguments != "{}":
            assert streamed.arguments == final.arguments


def kinds(run: Run) -> list[tuple[str, str]]:
    """(type-or-phase, text) of each output item."""
    out = []
    for item in run.items():
        label = item["type"]
        if label == "message":
            label = item["phase"]
        elif label in ("function_call", "custom_tool_call"):
            label = f"{label}:{item['name']}"
        out.append((label, final_text(item)))
    return out


# --- well-formed streams -------------------------------------------------------------------

CHUNK_SIZES = [(1,), (2,), (3, 1, 7), (1000,)]
TEXT = "Hello, world! Ünïcødé 日本語 🎉🎉 done."


@pytest.mark.parametrize("sizes", CHUNK_SIZES, ids=str)
def test_text_only(sizes: tuple[int, ...]) -> None:
    ids = tokens(f"<|channel|>final<|message|>{TEXT}<|return|>")
    run = drive(ids, sizes=sizes, prompt_tokens=120, cached_tokens=64)
    assert kinds(run) == [("final_answer", TEXT)]
    assert run.terminal["type"] == "response.completed"
    assert run.response.status == "completed"
    (item,) = run.items()
    assert item["status"] == "completed" and item["role"] == "assistant"
    assert item["content"][0]["annotations"] == [] and item["content"][0]["logprobs"] == []
    # Split UTF-8 characters never reach a delta half-decoded.
    assert all("\ufffd" not in e["delta"] for e in run.of_type("response.output_text.delta"))
    assert run.terminal["response"]["usage"] == {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0},
        "output_tokens": len(ids),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 120 + len(ids),
    }


@pytest.mark.parametrize("sizes", CHUNK_SIZES, ids=str)
def test_reasoning_then_text(sizes: tuple[int, ...]) -> None:
    thought = "The user wants a greeting. Keep it short."
    ids = tokens(
        f"<|channel|>analysis<|message|>{thought}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{TEXT}<|return|>"
    )
    run = drive(ids, sizes=sizes)
    assert kinds(run) == [("reasoning", thought), ("final_answer", TEXT)]
    reasoning = run.items()[0]
    assert reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": thought}]
    # Without sealing there is no key: the specification does not let it be null.
    assert "encrypted_content" not in reasoning
    assert "status" not in reasoning
    usage_out = run.terminal["response"]["usage"]["output_tokens_details"]
    assert usage_out["reasoning_tokens"] == len(ENCODING.encode(thought))
    deltas = "".join(e["delta"] for e in run.of_type("response.reasoning_text.delta"))
    assert deltas == thought


@pytest.mark.parametrize("sizes", CHUNK_SIZES, ids=str)
def test_reasoning_then_tool_call(sizes: tuple[int, ...]) -> None:
    arguments = '{"cmd":"ls -la /tmp && echo \\"done\\""}'
    ids = tokens(
        "<|channel|>analysis<|message|>I should list the files.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.exec_command "
        f"<|constrain|>json<|message|>{arguments}<|call|>"
    )
    run = drive(ids, sizes=sizes)
    assert kinds(run) == [
        ("reasoning", "I should list the files."),
        ("function_call:exec_command", arguments),
    ]
    done = run.of_type("response.output_item.done")[1]["item"]
    assert done["arguments"] == arguments and done["status"] == "completed"
    assert re.fullmatch(r"call_[0-9a-f]{24}", done["call_id"])
    assert re.fullmatch(r"fc_[0-9a-f]{32}", done["id"])
    assert "namespace" not in done
    assert run.of_type("response.function_call_arguments.done")[0]["arguments"] == arguments
    completed_call = run.terminal["response"]["output"][1]
    assert completed_call["arguments"] == arguments
    assert completed_call["call_id"] == done["call_id"]
    # The in-progress item announces the call with its name and id before the arguments.
    added = run.of_type("response.output_item.added")[1]["item"]
    assert added["arguments"] == "" and added["status"] == "in_progress"
    assert added["call_id"] == done["call_id"] and added["name"] == "exec_command"


@pytest.mark.parametrize(
    "separator",
    ["<|start|>assistant", ""],
    ids=["with-start", "bare-after-call"],
)
@pytest.mark.parametrize("sizes", [(1,), (4, 9), (1000,)], ids=str)
def test_parallel_tool_calls(separator: str, sizes: tuple[int, ...]) -> None:
    first, second = '{"cmd":"ls"}', '{"cmd":"pwd"}'
    ids = tokens(
        "<|channel|>commentary to=functions.exec_command <|constrain|>json"
        f"<|message|>{first}<|call|>{separator}"
        "<|channel|>commentary to=functions.exec_command <|constrain|>json"
        f"<|message|>{second}<|call|>"
    )
    run = drive(ids, sizes=sizes)
    assert kinds(run) == [
        ("function_call:exec_command", first),
        ("function_call:exec_command", second),
    ]
    calls = run.items()
    assert calls[0]["call_id"] != calls[1]["call_id"]
    assert calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize("sizes", CHUNK_SIZES, ids=str)
def test_custom_tool_call_gets_raw_text_input(sizes: tuple[int, ...]) -> None:
    ids = tokens(
        "<|channel|>analysis<|message|>Add the file.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.apply_patch"
        f"<|message|>{PATCH}<|call|>"
    )
    run = drive(ids, sizes=sizes)
    assert kinds(run) == [("reasoning", "Add the file."), ("custom_tool_call:apply_patch", PATCH)]
    call = run.items()[1]
    assert re.fullmatch(r"ctc_[0-9a-f]{32}", call["id"])
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["call_id"])
    assert run.of_type("response.custom_tool_call_input.done")[0]["input"] == PATCH
    assert not run.of_type("response.function_call_arguments.delta")


def test_function_call_without_arguments_is_added_and_done() -> None:
    ids = tokens(
        "<|channel|>commentary to=multi_agent_v1.close_agent <|constrain|>json<|message|><|call|>"
    )
    run = drive(ids)
    assert run.types[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (call,) = run.items()
    assert call["arguments"] == "{}"
    assert call["name"] == "close_agent" and call["namespace"] == "multi_agent_v1"


def test_preamble_is_a_commentary_message() -> None:
    ids = tokens(
        "<|channel|>commentary<|message|>Let me check the files.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        '<|message|>{"cmd":"ls"}<|call|>'
    )
    run = drive(ids, sizes=(2,))
    assert kinds(run) == [
        ("commentary", "Let me check the files."),
        ("function_call:exec_command", '{"cmd":"ls"}'),
    ]


UNKNOWN_CALL = (
    "<|channel|>analysis<|message|>Search the repo.<|end|>"
    '<|start|>assistant<|channel|>analysis to=repo_browser.search code<|message|>{"q":"x"}<|call|>'
)


@pytest.mark.parametrize("sizes", CHUNK_SIZES, ids=str)
def test_an_unknown_recipient_opens_no_item_and_is_kept_for_the_tool_loop(
    sizes: tuple[int, ...],
) -> None:
    """gpt-oss's invented `repo_browser.search` (no tool of the request): no item, no event of
    it, nothing the client must answer; the call is kept for the tool loop to answer."""
    run = drive(tokens(UNKNOWN_CALL), sizes=sizes)
    assert kinds(run) == [("reasoning", "Search the repo.")]
    added = [event["item"]["type"] for event in run.of_type("response.output_item.added")]
    assert added == ["reasoning"]
    assert "repo_browser" not in json.dumps(run.wire)
    assert run.translator.unknown_calls.calls == [UnknownCall("repo_browser.search", "analysis", 0)]
    # A call all the same: it counts toward max_tool_calls.
    assert run.translator.writer.tool_calls == 1


def test_an_undeclared_function_is_an_unknown_call_by_its_recipient() -> None:
    run = drive(
        tokens(
            '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"c":1}'
            "<|call|>"
        )
    )
    assert run.items() == [] and run.of_type("response.output_item.added") == []
    assert run.translator.unknown_calls.take() == [
        UnknownCall("functions.get_weather", "commentary", 0)
    ]
    assert run.translator.unknown_calls.calls == []  # taken: the loop's to answer


def test_a_header_only_unknown_call_is_kept_and_a_cut_short_one_is_not() -> None:
    salvaged = drive(tokens("<|channel|>commentary to=functions.nothing<|call|>"))
    assert salvaged.items() == []
    assert salvaged.translator.unknown_calls.calls == [
        UnknownCall("functions.nothing", "commentary", 0)
    ]
    # Cut by max_output_tokens: not a call the model made (the response ends incomplete).
    cut = drive(tokens('<|channel|>commentary to=functions.nothing<|message|>{"a"'), "length")
    assert cut.items() == [] and cut.translator.unknown_calls.calls == []
    assert cut.translator.writer.tool_calls == 0


def test_a_recipient_whose_bare_name_is_a_declared_tool_stays_that_tools_call() -> None:
    """`ToolRegistry.resolve` tolerates the model's slips: a wrong namespace before a declared
    function's name is still that function's call, as before."""
    run = drive(tokens('<|channel|>commentary to=repo.exec_command<|message|>{"cmd":"ls"}<|call|>'))
    assert kinds(run) == [("function_call:exec_command", '{"cmd":"ls"}')]
    assert run.translator.unknown_calls.calls == []


def test_an_unknown_call_counts_toward_max_tool_calls() -> None:
    ids = tokens(
        "<|channel|>commentary to=functions.nothing <|constrain|>json<|message|>{}<|call|>"
        '<|start|>assistant<|channel|>commentary to=functions.exec_command<|message|>{"cmd":"ls"}'
        "<|call|>"
    )
    run = drive(ids, max_tool_calls=1)
    assert run.items() == [] and run.translator.tool_calls_exhausted
    assert [call.recipient for call in run.translator.unknown_calls.calls] == ["functions.nothing"]


# --- terminal events -----------------------------------------------------------------------


def test_truncation_ends_incomplete_with_the_open_item_incomplete() -> None:
    ids = tokens(
        "<|channel|>analysis<|message|>Step one.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>The answer is"
    )
    run = drive(ids, finish="length", sizes=(3,))
    assert run.terminal["type"] == "response.incomplete"
    response = run.terminal["response"]
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [item["status"] for item in run.items()[1:]] == ["incomplete"]
    assert kinds(run) == [("reasoning", "Step one."), ("final_answer", "The answer is")]
    assert response["usage"]["output_tokens"] == len(ids)


def test_truncated_reasoning_and_tool_call_are_marked_incomplete() -> None:
    reasoning = drive(tokens("<|channel|>analysis<|message|>Thinking ab"), finish="length")
    assert reasoning.items()[0]["status"] == "incomplete"
    call = drive(
        tokens('<|channel|>commentary to=functions.exec_command<|message|>{"cmd": "l'),
        finish="length",
    )
    assert call.items() == [call.of_type("response.output_item.done")[0]["item"]]
    assert call.items()[0]["status"] == "incomplete"
    assert call.items()[0]["arguments"] == '{"cmd": "l'


def test_engine_error_fails_the_response_with_a_string_code() -> None:
    ids = tokens("<|channel|>final<|message|>Partial answ")
    run = drive(ids, fail=("The engine died.", "server_error"), sizes=(2,))
    assert run.terminal["type"] == "response.failed"
    response = run.terminal["response"]
    assert response["status"] == "failed"
    assert response["error"] == {"code": "server_error", "message": "The engine died."}
    (item,) = run.items()
    assert item["status"] == "incomplete" and final_text(item) == "Partial answ"


def test_codes_outside_the_sdk_literal_are_sent_as_given() -> None:
    # Codex treats context_length_exceeded as fatal (no retries): the code must survive.
    translator = new_translator()
    events = translator.start() + translator.fail("Too long.", "context_length_exceeded")
    data = decode_sse(encode_event(events[-1]))
    assert data["response"]["error"] == {"code": "context_length_exceeded", "message": "Too long."}
    # The SDK parses events without validating them; its accumulator takes this one.
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        parsed = construct_type(type_=ResponseStreamEvent, value=decode_sse(encode_event(event)))
        state.handle_event(parsed)  # type: ignore[arg-type]
    assert translator.response.error is not None
    assert translator.response.error.code == "context_length_exceeded"


def test_abort_ends_as_a_cancelled_response() -> None:
    run = drive(tokens("<|channel|>final<|message|>Half"), finish="abort")
    assert run.terminal["type"] == "response.incomplete"
    assert run.terminal["response"]["status"] == "cancelled"
    assert run.terminal["response"]["incomplete_details"] is None
    assert run.items()[0]["status"] == "incomplete"


def test_nothing_after_the_terminal_event() -> None:
    translator = new_translator()
    translator.start()
    translator.feed(tokens("<|channel|>final<|message|>ok<|return|>"))
    assert translator.finish("stop", prompt_tokens=1, cached_tokens=0)
    assert translator.feed(tokens("<|start|>assistant<|channel|>final<|message|>x")) == []
    assert translator.finish("stop", prompt_tokens=1, cached_tokens=0) == []
    assert translator.fail("late") == []
    assert translator.response.status == "completed"


# --- sealed reasoning ----------------------------------------------------------------------


def test_encrypted_content_only_when_sealing() -> None:
    thought = "private chain of thought"
    ids = tokens(
        f"<|channel|>analysis<|message|>{thought}<|end|>"
        "<|start|>assistant<|channel|>final<|message|>ok<|return|>"
    )
    sealed_texts: list[str] = []

    def seal(text: str) -> str:
        sealed_texts.append(text)
        return f"sealed:{len(text)}"

    sealed = drive(ids, seal=seal)
    reasoning = sealed.items()[0]
    assert reasoning["encrypted_content"] == f"sealed:{len(thought)}"
    assert sealed.of_type("response.output_item.done")[0]["item"] == reasoning
    assert sealed_texts == [thought]  # once, for the reasoning item only
    assert "encrypted_content" not in sealed.of_type("response.output_item.added")[0]["item"]
    assert sealed.response.output[0].encrypted_content == f"sealed:{len(thought)}"  # type: ignore[union-attr]

    plain = drive(ids)
    assert "encrypted_content" not in plain.items()[0]


def test_sealed_reasoning_opens_with_the_vault() -> None:
    vault = ReasoningVault("test-key")
    thought = "plan: read the file, then patch it"
    ids = tokens(
        f"<|channel|>analysis<|message|>{thought}<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        '<|message|>{"cmd":"cat a.txt"}<|call|>'
    )
    run = drive(ids, seal=vault.seal, sizes=(4,))
    blob = run.items()[0]["encrypted_content"]
    assert blob and thought not in blob
    assert vault.open(blob) == thought


# --- malformed harmony ---------------------------------------------------------------------

MALFORMED: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "text-without-header": (
        "Hello there, no header at all.<|return|>",
        [("final_answer", "Hello there, no header at all.")],
    ),
    "text-without-header-then-eos": ("Plain words", [("final_answer", "Plain words")]),
    "truncated-header": ("<|channel|>comm", []),
    "tokens-after-call": (
        '<|channel|>commentary to=functions.exec_command<|message|>{"cmd":"ls"}<|call|>trailing',
        [("function_call:exec_command", '{"cmd":"ls"}'), ("final_answer", "trailing")],
    ),
    "stray-end-tokens": (
        "<|channel|>final<|message|>x<|end|><|end|><|return|><|call|>",
        [("final_answer", "x")],
    ),
    "duplicated-recipient": (
        "<|channel|>commentary to=functions.exec_command to=functions.exec_command "
        '<|constrain|>json<|message|>{"cmd":"pwd"}<|call|>',
        [("function_call:exec_command", '{"cmd":"pwd"}')],
    ),
    "empty-channel": (
        "<|channel|><|message|>text anyway<|end|>",
        [("final_answer", "text anyway")],
    ),
    "missing-end-before-channel": (
        "<|channel|>analysis<|message|>think<|channel|>final<|message|>answer<|return|>",
        [("reasoning", "think"), ("final_answer", "answer")],
    ),
    "missing-end-before-start": (
        "<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final<|message|>a<|return|>",
        [("reasoning", "think"), ("final_answer", "a")],
    ),
    "missing-message-marker": (
        '<|channel|>commentary to=functions.exec_command <|constrain|>json{"cmd":"ls"}<|call|>',
        [("function_call:exec_command", '{"cmd":"ls"}')],
    ),
    "call-without-message": (
        "<|channel|>commentary to=functions.exec_command<|call|>",
        [("function_call:exec_command", "{}")],
    ),
    "recipient-before-channel": (
        " to=functions.exec_command<|channel|>commentary <|constrain|>json"
        '<|message|>{"cmd":"ls"}<|call|>',
        [("function_call:exec_command", '{"cmd":"ls"}')],
    ),
    "header-restarted": (
        "<|channel|>analy<|start|>assistant<|channel|>final<|message|>ok<|return|>",
        [("final_answer", "ok")],
    ),
    "start-without-role": (
        "<|channel|>final<|message|>a<|end|><|start|><|channel|>final<|message|>b<|return|>",
        [("final_answer", "a"), ("final_answer", "b")],
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
@pytest.mark.parametrize("sizes", [(1,), (2, 5), (1000,)], ids=str)
def test_malformed_harmony_recovers(name: str, sizes: tuple[int, ...]) -> None:
    harmony, expected = MALFORMED[name]
    run = drive(tokens(harmony), sizes=sizes)
    assert run.terminal["type"] == "response.completed"
    assert kinds(run) == expected


def test_invalid_token_ids_are_dropped_not_swallowing_the_message() -> None:
    head, tail = tokens("<|channel|>final<|message|>Hello"), tokens(" world<|return|>")
    run = drive([*head, 250_000, -1, *tail])
    assert kinds(run) == [("final_answer", "Hello world")]
    assert run.terminal["response"]["usage"]["output_tokens"] == len(head) + 2 + len(tail)


def test_long_headerless_text_streams_before_the_end() -> None:
    words = " ".join(f"word{i}" for i in range(200))
    translator = new_translator()
    translator.start()
    first = translator.feed(tokens("Plain text first. "))
    # Ordinary text right after `<|start|>assistant` is recognised at once, not at the end.
    assert "response.output_text.delta" in [event.type for event in first]
    translator.feed(tokens(words))
    translator.finish("stop", prompt_tokens=1, cached_tokens=0)
    assert translator.response.output_text == "Plain text first. " + words


def test_overlong_header_becomes_text() -> None:
    # A header is never this long: the model is writing after a stray `<|channel|>`.
    text = "final " + "blah " * 100
    run = drive(tokens(f"<|channel|>{text}<|return|>"), sizes=(7,))
    assert kinds(run) == [("final_answer", "blah " * 100)]


SPECIAL_IDS = [199998, 199999, 200000, 200002, 200003, 200005, 200006, 200007, 200008, 200012]


def garbage(seed: int, size: int) -> list[int]:
    rng = random.Random(seed)
    out = []
    for _ in range(size):
        roll = rng.random()
        if roll < 0.25:
            out.append(rng.choice(SPECIAL_IDS))
        elif roll < 0.3:
            out.append(rng.randrange(199998, 201089))  # reserved specials
        elif roll < 0.31:
            out.append(rng.choice([201_089, 250_000, -5]))  # outside the vocabulary
        else:
            out.append(rng.randrange(0, 199998))
    return out


@pytest.mark.parametrize("size", [1, 5, 40, 300, 2000])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ending", ["stop", "length", "fail"])
def test_garbage_tokens_give_a_well_formed_stream(size: int, seed: int, ending: str) -> None:
    ids = garbage(seed * 1000 + size, size)
    sizes = (1, 2, 3, 50) if size > 5 else (1,)
    if ending == "fail":
        run = drive(ids, sizes=sizes, fail=("boom", "server_error"))
        assert run.terminal["type"] == "response.failed"
    else:
        run = drive(ids, finish=ending, sizes=sizes)
        expected = "response.completed" if ending == "stop" else "response.incomplete"
        assert run.terminal["type"] == expected
    assert run.terminal["response"]["output"] == [
        item.model_dump(mode="json", by_alias=True, exclude_unset=True)
        for item in run.translator.output_items
    ]


@pytest.mark.parametrize("seed", range(5))
def test_a_tool_call_after_garbage_is_still_recovered(seed: int) -> None:
    call = tokens(
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        '<|message|>{"cmd":"ls"}<|call|>'
    )
    run = drive(garbage(seed, 200) + call, sizes=(5,))
    assert kinds(run)[-1] == ("function_call:exec_command", '{"cmd":"ls"}')


def test_translators_share_no_parser_state() -> None:
    a_ids = tokens("<|channel|>final<|message|>first response<|return|>")
    b_ids = tokens("<|channel|>analysis<|message|>second<|end|>")
    a, b = new_translator(), new_translator()
    a.start(), b.start()
    for a_chunk, b_chunk in zip(chunked(a_ids, (2,)), chunked(b_ids, (2,)), strict=False):
        a.feed(a_chunk)
        b.feed(b_chunk)
    a.finish("stop", prompt_tokens=1, cached_tokens=0)
    b.finish("stop", prompt_tokens=1, cached_tokens=0)
    assert a.response.output_text == "first response"
    assert [item.type for item in b.response.output] == ["reasoning"]


# --- the response template, usage and the SSE encoding ---------------------------------------


def test_initial_response_echoes_the_request() -> None:
    request = ResponsesRequest.model_validate(REQUEST_BODY)
    response = initial_response(request, response_id="resp_" + "a" * 32, model=MODEL)
    Response.model_validate(response.model_dump(by_alias=True))
    assert response.status == "in_progress" and response.output == []
    # Every tool is echoed as sent, in its order.
    assert [tool.type for tool in response.tools] == [
        "function",
        "custom",
        "tool_search",
        "namespace",
    ]
    assert response.tools[2].model_dump(exclude_none=True) == {
        "type": "tool_search",
        "execution": "client",
    }
    assert response.tool_choice == "auto" and response.parallel_tool_calls is True
    assert response.metadata == {"k": "v"} and response.prompt_cache_key == "thread-1"
    assert response.reasoning is not None and response.reasoning.effort == "high"
    assert response.max_output_tokens == 512
    assert response.temperature == 1.0 and response.top_p == 1.0
    assert response.model_dump()["store"] is False


def test_initial_response_named_tool_choice() -> None:
    body = {**REQUEST_BODY, "tool_choice": {"type": "custom", "name": "apply_patch"}}
    response = initial_response(
        ResponsesRequest.model_validate(body), response_id="resp_x", model=MODEL
    )
    assert response.tool_choice.model_dump() == {"type": "custom", "name": "apply_patch"}  # type: ignore[union-attr]


def test_new_response_id_format() -> None:
    assert re.fullmatch(r"resp_[0-9a-f]{32}", new_response_id())
    assert new_response_id() != new_response_id()


def test_usage_reports_cache_writes_and_totals() -> None:
    reported = usage(prompt_tokens=50, cached_tokens=32, output_tokens=7, reasoning_tokens=3)
    assert reported.model_dump(exclude_none=True) == {
        "input_tokens": 50,
        "input_tokens_details": {"cached_tokens": 32, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 57,
    }


def test_sse_encoding_keeps_required_nulls_and_drops_unset_fields() -> None:
    translator = new_translator()
    created = translator.start()[0]
    raw = encode_event(created)
    assert raw.startswith(b"event: response.created\ndata: {")
    assert raw.endswith(b"}\n\n") and b"[DONE]" not in raw
    response = decode_sse(raw)["response"]
    for key in ("error", "incomplete_details", "usage", "instructions", "completed_at"):
        assert key in response and response[key] is None
    assert response["background"] is False  # echoed, as OpenAI does
    # Unset fields stay out: `conversation` only with a conversation, none of the SDK's
    # fields for features this server has not (moderation, tool_usage...).
    assert set(response) == open_responses.RESPONSE_FIELDS
    assert isinstance(response["created_at"], int)
    assert response["tools"][1] == {
        "type": "custom",
        "name": "apply_patch",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
    }


def test_dump_response_is_the_wire_form() -> None:
    body = {
        **REQUEST_BODY,
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
    }
    translator = new_translator(body=body)
    translator.start()
    translator.feed(tokens('<|channel|>final<|message|>{"a":1}<|return|>'))
    translator.finish("stop", prompt_tokens=3, cached_tokens=0)
    data = dump_response(translator.response)
    # API names (`schema`, not the SDK's `schema_`) and integer timestamps, as OpenAI sends.
    assert data["text"]["format"] == {
        "type": "json_schema",
        "name": "out",
        "schema": {"type": "object"},
        "description": None,
        "strict": False,
    }
    assert isinstance(data["created_at"], int) and isinstance(data["completed_at"], int)
    assert data["status"] == "completed" and data["error"] is None
    assert Response.model_validate(data).output_text == '{"a":1}'


def test_sse_data_is_utf8_not_ascii_escaped() -> None:
    translator = new_translator()
    events = translator.start() + translator.feed(tokens(f"<|channel|>final<|message|>{TEXT}"))
    raw = b"".join(encode_event(event) for event in events)
    assert "日本語".encode() in raw and b"\\u" not in raw


def test_stop_token_constants_end_messages() -> None:
    # The ids the engine stops on are the ones the translator treats as message ends.
    for stop in (RETURN_TOKEN, CALL_TOKEN, END_TOKEN):
        run = drive([*tokens("<|channel|>final<|message|>hi"), stop])
        assert kinds(run) == [("final_answer", "hi")]
        assert run.items()[0]["status"] == "completed"


# --- spec-complete Responses ---------------------------------------------------------------


def wire_response(body: dict[str, Any]) -> dict[str, Any]:
    request = ResponsesRequest.model_validate(body)
    response = dump_response(initial_response(request, response_id="resp_x", model=MODEL))
    if open_responses.available():
        open_responses.check_response(response)
    return response


def test_a_response_carries_every_field_with_openai_defaults() -> None:
    response = wire_response({"model": MODEL, "input": "hi"})
    assert set(response) == open_responses.RESPONSE_FIELDS
    defaults = open_responses.OPENAI_DEFAULTS
    assert {key: response[key] for key in defaults} == defaults


def test_a_response_echoes_the_request_fields() -> None:
    body = {
        "model": MODEL,
        "input": "hi",
        "truncation": "auto",
        "presence_penalty": -1.5,
        "frequency_penalty": 2,
        "top_logprobs": 20,
        "max_tool_calls": 3,
        "service_tier": "auto",
        "safety_identifier": "user-hash",
        "user": "legacy-user",
        "prompt_cache_retention": "24h",
        "reasoning": {"effort": "low", "summary": "detailed"},
        "text": {"verbosity": "low"},
    }
    response = wire_response(body)
    expected = {key: body[key] for key in body if key not in ("model", "input", "text")}
    expected["service_tier"] = "default"  # the tier that served it, as OpenAI reports "auto"
    assert {key: response[key] for key in expected} == expected
    assert response["text"] == {"format": {"type": "text"}, "verbosity": "low"}


def test_tools_echo_every_field_and_strict() -> None:
    tools = [
        {"type": "function", "name": "plain"},
        {"type": "function", "name": "loose", "strict": False, "description": "d"},
        {"type": "function", "function": {"name": "nested", "parameters": {"type": "object"}}},
    ]
    response = wire_response({"model": MODEL, "input": "hi", "tools": tools})
    assert response["tools"] == [
        # The Responses API's default: strict.
        {"type": "function", "name": "plain", "description": None, "parameters": None,
         "strict": True},
        {"type": "function", "name": "loose", "description": "d", "parameters": None,
         "strict": False},
        {"type": "function", "name": "nested", "description": None,
         "parameters": {"type": "object"}, "strict": True},
    ]  # fmt: skip


def test_a_json_schema_format_is_echoed_whole() -> None:
    text = {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}}
    response = wire_response({"model": MODEL, "input": "hi", "text": text})
    assert response["text"]["format"] == {
        "type": "json_schema",
        "name": "out",
        "schema": {"type": "object"},
        "description": None,
        "strict": False,
    }


@pytest.mark.parametrize(
    "field",
    [
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"top_logprobs": 21},
        {"top_logprobs": -1},
        {"max_tool_calls": 0},
        {"truncation": "sometimes"},
        {"service_tier": "fastest"},
        {"prompt_cache_retention": "1h"},
        {"reasoning": {"summary": "verbose"}},
        {"text": {"verbosity": "loud"}},
        {"safety_identifier": "x" * 129},
    ],
    ids=str,
)
def test_request_fields_outside_openai_bounds_are_rejected(field: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ResponsesRequest.model_validate({"model": MODEL, "input": "hi", **field})


def test_streamed_responses_follow_the_open_responses_spec() -> None:
    open_responses.require_spec()
    ids = tokens(
        "<|channel|>analysis<|message|>Plan it.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Running it.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        '<|message|>{"cmd":"ls"}<|call|>'
    )
    for summarize in (False, True):
        run = drive(ids, summarize=summarize, seal=lambda text: "sealed", sizes=(3,))
        for event in run.wire:
            open_responses.check_event(event)
        open_responses.check_response(dump_response(run.response))
    # The check can fail: a null `encrypted_content` is not an Open Responses reasoning item.
    with pytest.raises(AssertionError, match="ItemField"):
        open_responses.check_item({**run.items()[0], "encrypted_content": None})


# --- reasoning summaries -------------------------------------------------------------------

THOUGHT = "The user wants a greeting. Ünïcødé 🎉 keeps it short."
REASONING_THEN_TEXT = (
    f"<|channel|>analysis<|message|>{THOUGHT}<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{TEXT}<|return|>"
)


@pytest.mark.parametrize("sizes", CHUNK_SIZES, ids=str)
def test_a_summary_holds_the_chain_of_thought_streamed(sizes: tuple[int, ...]) -> None:
    run = drive(tokens(REASONING_THEN_TEXT), sizes=sizes, summarize=True)
    reasoning = run.items()[0]
    assert reasoning["summary"] == [{"type": "summary_text", "text": THOUGHT}]
    # The content stays as it is: Codex and the chain-of-thought resend read it.
    assert reasoning["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    item_events = [e["type"] for e in run.wire if e.get("output_index") == 0]
    assert item_events[:3] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_summary_part.added",
    ]
    assert item_events[-5:] == [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
    ]
    summary_deltas = run.of_type("response.reasoning_summary_text.delta")
    text_deltas = run.of_type("response.reasoning_text.delta")
    # Streamed as generated: each reasoning delta is also a summary delta, right after it.
    assert [e["delta"] for e in summary_deltas] == [e["delta"] for e in text_deltas]
    assert all(e["item_id"] == reasoning["id"] for e in summary_deltas)
    # The added item announces no summary yet; the message after it has none at all.
    assert run.of_type("response.output_item.added")[0]["item"]["summary"] == []
    assert "summary" not in run.items()[1]


def test_without_a_summary_nothing_changes() -> None:
    plain = drive(tokens(REASONING_THEN_TEXT), sizes=(2,))
    summarized = drive(tokens(REASONING_THEN_TEXT), sizes=(2,), summarize=True)
    assert not [t for t in plain.types if "reasoning_summary" in t]
    assert plain.items()[0]["summary"] == []
    # The summary events are added; the others are the same, in the same order.
    assert [t for t in summarized.types if "reasoning_summary" not in t] == plain.types


def test_a_cut_off_chain_of_thought_is_summarized_as_far_as_it_went() -> None:
    ids = tokens("<|channel|>analysis<|message|>I will first look at the")
    run = drive(ids, finish="length", summarize=True, sizes=(3,))
    (reasoning,) = run.items()
    assert reasoning["status"] == "incomplete"
    assert reasoning["summary"] == [{"type": "summary_text", "text": "I will first look at the"}]


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_summaries_survive_malformed_harmony(name: str) -> None:
    harmony, expected = MALFORMED[name]
    run = drive(tokens(harmony), sizes=(2, 5), summarize=True)
    assert kinds(run) == expected
    for item in run.items():
        if item["type"] == "reasoning":
            assert item["summary"] == [{"type": "summary_text", "text": final_text(item)}]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ending", ["stop", "length", "fail"])
def test_garbage_with_summaries_gives_a_well_formed_stream(seed: int, ending: str) -> None:
    ids = garbage(seed * 7 + 3, 600)
    fail = ("boom", "server_error") if ending == "fail" else None
    drive(ids, finish=ending, sizes=(1, 2, 3, 50), fail=fail, summarize=True)


# --- max_tool_calls ------------------------------------------------------------------------

THREE_CALLS = (
    "<|channel|>analysis<|message|>Three commands.<|end|>"
    + "".join(
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        f'<|message|>{{"cmd":"{cmd}"}}<|call|>'
        for cmd in ("ls", "pwd", "id")
    )
    + "<|start|>assistant<|channel|>final<|message|>after the calls<|return|>"
)


@pytest.mark.parametrize("limit", [1, 2])
@pytest.mark.parametrize("sizes", [(1,), (7,), (1000,)], ids=str)
def test_max_tool_calls_ends_the_response_after_the_last_call(
    limit: int, sizes: tuple[int, ...]
) -> None:
    ids = tokens(THREE_CALLS)
    run = drive(ids, sizes=sizes, max_tool_calls=limit)
    assert kinds(run) == [
        ("reasoning", "Three commands."),
        *[("function_call:exec_command", f'{{"cmd":"{cmd}"}}') for cmd in ("ls", "pwd")[:limit]],
    ]
    assert run.translator.tool_calls_exhausted
    assert run.terminal["type"] == "response.completed"
    # What the engine generated past the limit still counts as generated.
    assert run.terminal["response"]["usage"]["output_tokens"] == len(ids)


def test_without_max_tool_calls_every_call_is_made() -> None:
    run = drive(tokens(THREE_CALLS))
    assert [label for label, _ in kinds(run)].count("function_call:exec_command") == 3
    assert kinds(run)[-1] == ("final_answer", "after the calls")
    assert not run.translator.tool_calls_exhausted
    # The third call of three allowed ends it too.
    assert kinds(drive(tokens(THREE_CALLS), max_tool_calls=3))[-1][0] != "final_answer"


def test_a_constrained_final_message_is_a_message_not_a_tool_call() -> None:
    # The model may mark a JSON answer's content type on the final channel; harmony's parser
    # then reports `<|constrain|>json` as the recipient. It is the answer, not a call.
    run = drive(tokens('<|channel|>final <|constrain|>json<|message|>{"a": 1}<|return|>'))
    check_stream(run)
    assert kinds(run) == [("final_answer", '{"a": 1}')]


# --- logprobs ------------------------------------------------------------------------------


def logprob_positions(entries: list[dict[str, Any]]) -> list[int]:
    """The completion positions `stand_in_logprob` encoded in ``entries``' values."""
    return [round(-entry["logprob"] * 1000) - 1 for entry in entries]


def content_positions(ids: Sequence[int], content: str) -> list[int]:
    """Positions in ``ids`` of the tokens of ``content``, which follows the last
    ``<|message|>`` before it."""
    before = tokens(content)
    for start in range(len(ids) - len(before), -1, -1):
        if list(ids[start : start + len(before)]) == before:
            return list(range(start, start + len(before)))
    raise AssertionError("content not in ids")


@pytest.mark.parametrize("sizes", CHUNK_SIZES, ids=str)
@pytest.mark.parametrize("top", [0, 3, 20])
def test_logprobs_of_the_output_text_ride_on_its_deltas(sizes: tuple[int, ...], top: int) -> None:
    thought = "Reasoning has no logprobs."
    preamble = "Looking: 🎉"
    harmony = (
        f"<|channel|>analysis<|message|>{thought}<|end|>"
        f"<|start|>assistant<|channel|>commentary<|message|>{preamble}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{TEXT}<|return|>"
    )
    ids = tokens(harmony)
    run = drive(ids, sizes=sizes, top_logprobs=top)
    assert kinds(run) == [("reasoning", thought), ("commentary", preamble), ("final_answer", TEXT)]
    for index, text in ((1, preamble), (2, TEXT)):
        of_item = [e for e in run.wire if e.get("output_index") == index]
        deltas = [e for e in of_item if e["type"] == "response.output_text.delta"]
        part = run.items()[index]["content"][0]
        entries = part["logprobs"]
        # One entry per token of the text, none for header or stop tokens, in order.
        assert logprob_positions(entries) == content_positions(ids, text)
        assert b"".join(bytes(entry["bytes"]) for entry in entries) == text.encode()
        assert all(len(entry["top_logprobs"]) == top for entry in entries)
        for entry in entries:
            for alternative in entry["top_logprobs"]:
                token = bytes(alternative["bytes"]).decode(errors="replace")
                assert token == alternative["token"]
        # Each delta carries the entries of the tokens whose text it first shows.
        assert all(delta["logprobs"] for delta in deltas)
        streamed = [entry for delta in deltas for entry in delta["logprobs"]]
        assert [(e["token"], e["logprob"]) for e in streamed] == [
            (e["token"], e["logprob"]) for e in entries
        ]
        for delta in deltas:
            if "\ufffd" not in "".join(e["token"] for e in delta["logprobs"]):
                assert "".join(e["token"] for e in delta["logprobs"]) == delta["delta"]
        (done,) = [e for e in of_item if e["type"] == "response.output_text.done"]
        assert [(e["token"], e["logprob"]) for e in done["logprobs"]] == [
            (e["token"], e["logprob"]) for e in entries
        ]
    reasoning_deltas = run.of_type("response.reasoning_text.delta")
    assert reasoning_deltas and all("logprobs" not in delta for delta in reasoning_deltas)


def test_a_token_that_splits_a_character_keeps_its_bytes() -> None:
    ids = tokens("<|channel|>final<|message|>🎉<|return|>")
    run = drive(ids, top_logprobs=1)
    entries = run.items()[0]["content"][0]["logprobs"]
    assert len(entries) == 2  # 🎉 is two tokens, neither a character
    assert [bytes(entry["bytes"]) for entry in entries] == [b"\xf0\x9f\x8e", b"\x89"]
    assert [entry["token"] for entry in entries] == ["\ufffd", "\ufffd"]
    (delta,) = run.of_type("response.output_text.delta")
    assert delta["delta"] == "🎉" and len(delta["logprobs"]) == 2


class CountingParser(StreamableParser):
    """Harmony's parser, counting the reads of ``current_content`` (which decodes every token
    of the message again)."""

    reads = 0

    @property
    def current_content(self) -> str:
        CountingParser.reads += 1
        return super().current_content


def test_a_long_message_is_not_decoded_again_with_every_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chunk's delta is what its tokens decoded to, not the whole message decoded again and
    compared with what was sent: that made a message's cost grow with the square of its
    length (11 µs a token at 2,000 tokens, 68 µs at 16,000: loadtests/bench_stream.py
    --translator). Characters split across tokens still arrive whole."""
    monkeypatch.setattr(stream_module, "StreamableParser", CountingParser)
    monkeypatch.setattr(CountingParser, "reads", 0)
    text = "Streaming a long answer (Ünïcødé 日本語 🎉). " * 150
    ids = tokens(f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"
                 f"<|channel|>final<|message|>{text}<|return|>")  # fmt: skip
    run = drive(ids, sizes=(1, 3, 2))
    assert len(ids) > 4000 and CountingParser.reads == 0
    reasoning, message = run.items()
    assert reasoning["content"][0]["text"] == text and final_text(message) == text
    deltas = [e["delta"] for e in run.of_type("response.output_text.delta")]
    assert "".join(deltas) == text and len(deltas) > 1000
    assert not any("\ufffd" in delta for delta in deltas)


def test_headerless_text_gets_logprobs_for_all_its_tokens() -> None:
    ids = tokens("Hello there, no header.<|return|>")
    run = drive(ids, top_logprobs=2)
    entries = run.items()[0]["content"][0]["logprobs"]
    assert logprob_positions(entries) == list(range(len(ids) - 1))
    assert "".join(entry["token"] for entry in entries) == "Hello there, no header."


def test_tool_calls_and_truncated_text_without_stray_logprobs() -> None:
    ids = tokens(
        '<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>{"cmd":'
        '"ls"}<|call|><|start|>assistant<|channel|>final<|message|>cut short here'
    )
    run = drive(ids, finish="length", top_logprobs=1)
    call, message = run.items()
    assert call["type"] == "function_call"
    entries = message["content"][0]["logprobs"]
    assert logprob_positions(entries) == content_positions(ids, "cut short here")
    assert message["status"] == "incomplete"


def test_no_logprobs_without_engine_entries() -> None:
    run = drive(tokens(f"<|channel|>final<|message|>{TEXT}<|return|>"))
    assert all(e["logprobs"] == [] for e in run.of_type("response.output_text.delta"))
    assert run.items()[0]["content"][0]["logprobs"] == []
