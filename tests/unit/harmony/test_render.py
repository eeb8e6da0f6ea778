"""Requests from real clients parse and render to the harmony prompt gpt-oss expects."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.render import render_request
from serve_app.harmony.tool_messages import (
    LongPiece,
    TooManyTokens,
    _piece_boundary,
    tool_message_tokens,
)
from serve_app.protocol.body_errors import from_validation_errors
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.admission import responses as validation
from tests.support import MODEL, REPO
from tests.support.helpers import CAPTURES, capture_body, decode

NOW = datetime(2026, 11, 22, tzinfo=UTC)


def render_text(body: dict, vault: ReasoningVault | None = None) -> str:
    """Checked as the service checks a request before rendering it, then rendered."""
    request = ResponsesRequest.model_validate(body)
    validation.check_items(request, vault=vault)
    return decode(render_request(request, vault=vault, now=NOW).token_ids)


def test_captures_exist() -> None:
    assert len(CAPTURES) >= 9, "the Codex captures in tests/fixtures/codex are the fixtures"


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_codex_capture_parses_and_renders(path) -> None:
    body = capture_body(f"{path.parent.name}/{path.stem}")
    text = render_text(body)
    assert text.startswith("<|start|>system<|message|>")
    assert "Reasoning: medium" in text and "Current date: 2026-11-22" in text
    assert text.endswith("<|start|>assistant")
    # The base prompt (input[0] developer message or `instructions`) is the developer message.
    assert "<|start|>developer<|message|># Instructions\n\nYou are a coding agent" in text
    assert "Do the task" in text
    # Hosted tools never reach rendering (the door refuses those neither shown nor run:
    # tool_types.py); function tools are described.
    assert "web_search" not in text.split("<|start|>user")[0]


def test_tool_loop_turn_keeps_outputs_and_previous_reasoning() -> None:
    text = render_text(capture_body("reasoning_tool/req_002"))
    tail = text.split("Do the task<|end|>")[1]
    assert tail.startswith(
        "<|start|>assistant<|channel|>analysis<|message|>"
        "I should run a shell command to create the marker file.<|end|>"
    )
    assert (
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
        in tail
    )
    assert '{"cmd": "echo hello-from-stub > stub_marker.txt; cat stub_marker.txt"}<|call|>' in tail
    assert (
        "<|start|>functions.exec_command<|channel|>commentary to=assistant<|message|>Chunk ID"
        in tail
    )


def test_codex_063_shell_turn_renders_instructions_and_shell_output() -> None:
    text = render_text(capture_body("old_reasoning_tool/req_002"))
    assert "# Instructions\n\nYou are a coding agent" in text
    assert "<|start|>functions.shell<|channel|>commentary to=assistant<|message|>" in text
    assert "hello-from-stub" in text


def test_custom_tool_renders_as_freeform_and_its_call_as_raw_text() -> None:
    text = render_text(capture_body("patch/req_002"))
    assert "type apply_patch = () => any;" in text
    assert "FREEFORM tool" in text and "begin_patch" in text
    # The custom call is raw text (no <|constrain|>json), its output comes from functions.NAME.
    assert (
        "<|start|>assistant<|channel|>commentary to=functions.apply_patch<|message|>"
        "*** Begin Patch\n*** Add File: patched_by_stub.txt" in text
    )
    assert (
        "<|start|>functions.apply_patch<|channel|>commentary to=assistant<|message|>Exit code: 0"
        in text
    )


def test_namespace_tools_render_as_harmony_namespaces() -> None:
    text = render_text(capture_body("tool/req_001"))
    assert "namespace multi_agent_v1 {" in text
    assert "type close_agent = " in text


def _turns_body(*items: dict) -> dict:
    return {"model": MODEL, "input": list(items), "tools": [_weather_tool()]}


def _weather_tool() -> dict:
    return {
        "type": "function",
        "name": "get_weather",
        "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _reasoning(text: str) -> dict:
    return {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def _call(call_id: str) -> dict:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    }


def _output(call_id: str, output: object = "sunny") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _assistant(text: str, phase: str | None = None) -> dict:
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }
    if phase:
        item["phase"] = phase
    return item


def test_reasoning_of_a_finished_turn_is_dropped_and_the_current_turn_kept() -> None:
    text = render_text(
        _turns_body(
            _user("weather?"),
            _reasoning("OLD-THOUGHT"),
            _call("c1"),
            _output("c1"),
            _assistant("It is sunny."),
            _user("and tomorrow?"),
            _reasoning("NEW-THOUGHT"),
            _call("c2"),
            _output("c2", [{"type": "input_text", "text": "rain"}]),
        )
    )
    assert "OLD-THOUGHT" not in text
    assert "<|channel|>analysis<|message|>NEW-THOUGHT<|end|>" in text
    assert "<|channel|>final<|message|>It is sunny.<|end|>" in text
    assert "<|channel|>commentary to=assistant<|message|>rain<|end|>" in text


def test_a_preamble_before_tool_calls_stays_commentary_not_final() -> None:
    for preamble in (
        _assistant("Checking the weather.", "commentary"),
        _assistant("Checking the weather."),
    ):
        text = render_text(_turns_body(_user("weather?"), preamble, _call("c1"), _output("c1")))
        assert "<|channel|>commentary<|message|>Checking the weather.<|end|>" in text
        assert "<|channel|>final" not in text


def test_encrypted_reasoning_comes_back_and_a_foreign_blob_is_ignored() -> None:
    vault = ReasoningVault("test-key")
    sealed = {"type": "reasoning", "summary": [], "encrypted_content": vault.seal("SEALED-THOUGHT")}
    foreign = {
        "type": "reasoning",
        "summary": [],
        "encrypted_content": ReasoningVault("other-key").seal("FOREIGN"),
    }
    garbage = {"type": "reasoning", "summary": [], "encrypted_content": "not base64 at all!"}
    text = render_text(
        _turns_body(_user("weather?"), sealed, foreign, garbage, _call("c1"), _output("c1")),
        vault=vault,
    )
    assert "<|channel|>analysis<|message|>SEALED-THOUGHT<|end|>" in text
    assert "FOREIGN" not in text


def test_nested_chat_completions_tools_and_string_input() -> None:
    body = {
        "model": MODEL,
        "input": "hello",
        "instructions": "Be brief.",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Find",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            },
            {"type": "web_search"},
            {"type": "file_search", "vector_store_ids": ["x"]},
        ],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "reasoning": {"effort": "high"},
    }
    text = render_text(body)
    assert "Reasoning: high" in text
    assert "type lookup = (_: {" in text
    assert "You must call the `lookup` tool now." in text
    assert "<|start|>user<|message|>hello<|end|><|start|>assistant" in text


def test_tool_choice_none_leaves_tools_out() -> None:
    body = _turns_body(_user("hi"))
    body["tool_choice"] = "none"
    assert "get_weather" not in render_text(body)


@pytest.mark.parametrize(
    ("items", "message", "param"),
    [
        (
            [_user("x"), _call("c1")],
            "No tool output found for function call c1.",
            "input[1].call_id",
        ),
        (
            [_user("x"), _output("c9")],
            "No tool call found for function call output with call_id c9.",
            "input[1].call_id",
        ),
    ],
)
def test_unpaired_tool_calls_are_rejected(items, message, param) -> None:
    with pytest.raises(InvalidRequest) as caught:
        render_text(_turns_body(*items))
    assert caught.value.message == message
    assert caught.value.param == param


def test_unknown_named_tool_choice_is_rejected() -> None:
    body = _turns_body(_user("x"))
    body["tool_choice"] = {"type": "function", "name": "nope"}
    with pytest.raises(InvalidRequest) as caught:
        render_text(body)
    assert caught.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "input": [{"type": "bogus"}]}, "input[0]"),
        (
            {"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "weird"}]}]},
            "input[0].content[0]",
        ),
        ({"model": "m", "input": "x", "temperature": 7}, "temperature"),
        ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "x"}, "model"),
    ],
)
def test_validation_errors_name_the_offending_param(body, param) -> None:
    with pytest.raises(ValidationError) as caught:
        ResponsesRequest.model_validate(body)
    error = from_validation_errors(caught.value.errors())
    assert error.param == param
    assert error.status_code == 400
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_a_tool_schema_too_deep_for_harmony_is_a_400() -> None:
    nested: object = {"type": "string"}
    for _ in range(80):
        nested = {"type": "object", "properties": {"a": nested}}
    body = {
        "model": "m",
        "input": "hi",
        "tools": [{"type": "function", "name": "deep", "parameters": nested}],
    }
    with pytest.raises(InvalidRequest) as caught:
        render_text(body)
    assert caught.value.status_code == 400


def test_a_tool_message_over_a_bound_is_found_from_a_prefix_that_matches_the_whole() -> None:
    """`tool_message_tokens` cuts a prefix where o200k's pieces never span (a space after a
    non-space) and tokenizes only that to find a message over its bound; below, the whole
    message. The prefix's tokens are the whole message's first ones, wherever it is cut."""
    text = (REPO / "docs" / "protocol.md").read_text()[:60_000]
    whole = tool_message_tokens("docs.read", "commentary", text)
    for at in range(1_000, 60_000, 997):
        cut = _piece_boundary(text, at)
        assert 0 < cut <= at and text[cut] == " " and not text[cut - 1].isspace()
        body = tool_message_tokens("docs.read", "commentary", text[:cut])[:-1]  # no <|end|>
        assert whole[: len(body)] == body
    assert tool_message_tokens("docs.read", "commentary", text, len(whole)) == whole
    with pytest.raises(TooManyTokens) as over:
        tool_message_tokens("docs.read", "commentary", text, 1_000)
    assert 1_000 < over.value.tokens < len(whole)  # a prefix told it: not all was tokenized
    with pytest.raises(LongPiece):
        tool_message_tokens("docs.read", "commentary", "x" * 20_001)
