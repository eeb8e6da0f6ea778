"""Constrained decoding through harmony (issue 20): the grammar, its compiler, its sampler.

Completions drawn by the seeded masked sampler must be valid by construction: they parse
with harmony and our stream translator into the right items, and their JSON validates against
the request's schemas (or their input parses with the custom tool's grammar).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import jsonschema
import pytest
from openai_harmony import Role
from pydantic import BaseModel, ConfigDict

from serve_app.constraints import build, spec
from serve_app.constraints.grammar import to_lark
from serve_app.constraints.matcher import (
    ConstraintError,
    cache_info,
    compile_grammar,
    new_matcher,
)
from serve_app.constraints.sampling import MaskedSampler
from serve_app.constraints.vocab import harmony_tokenizer
from serve_app.harmony.encoding import CALL_TOKEN, RETURN_TOKEN, get_encoding
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import initial_response, new_response_id
from tests.support import MODEL
from tests.support.helpers import CODEX_CAPTURES


def constraint_of(request: ResponsesRequest) -> spec.CompletionConstraint | None:
    """The request's constraint, its tools as the door builds them (no history here)."""
    return build.from_request(request, ToolRegistry.from_request(request))


ENCODING = get_encoding()
SEEDS = range(50)
MAX_TOKENS = 600
CODEX_PATCH_REQUEST = CODEX_CAPTURES / "patch" / "req_001.json"


# --- schemas as clients write them ----------------------------------------------------------


class _Strict(BaseModel):
    # additionalProperties: false, and every field without a default is required: what the
    # openai SDK's strict schemas look like.
    model_config = ConfigDict(extra="forbid")


class Address(_Strict):
    city: str
    zip: str
    kind: Literal["home", "work"]


class Person(_Strict):
    name: str
    age: int
    address: Address  # Pydantic puts Address under $defs and refers to it with $ref
    tags: list[str]
    nickname: str | None  # anyOf [string, null]


class Step(_Strict):
    explanation: str
    output: str


class MathReasoning(_Strict):
    steps: list[Step]
    final_answer: float
    confident: bool


EXEC_COMMAND = {
    "type": "object",
    "properties": {
        "cmd": {"type": "string"},
        "timeout_ms": {"type": ["integer", "null"]},
        "shell": {"enum": ["bash", "sh"]},
    },
    "required": ["cmd", "timeout_ms", "shell"],
    "additionalProperties": False,
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": Person.model_json_schema(),
    "math": MathReasoning.model_json_schema(),
    "exec": EXEC_COMMAND,
}


def _tools() -> list[dict[str, Any]]:
    return [
        {"type": "function", "name": "exec_command", "strict": True, "parameters": EXEC_COMMAND},
        {
            "type": "namespace",
            "name": "people",
            "tools": [
                {
                    "type": "function",
                    "name": "add_person",
                    "strict": True,
                    "parameters": SCHEMAS["person"],
                }
            ],
        },
        # Not strict: its arguments are free text.
        {"type": "function", "name": "note", "parameters": {"type": "object"}},
    ]


def _request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": MODEL, "input": "go", **fields})


def _json_format(name: str) -> dict[str, Any]:
    return {
        "format": {"type": "json_schema", "name": name, "strict": True, "schema": SCHEMAS[name]}
    }


# --- drawing and reading completions --------------------------------------------------------


def _draw(request: ResponsesRequest, seed: int) -> list[int]:
    constraint = constraint_of(request)
    assert constraint is not None
    sampler = MaskedSampler(new_matcher(constraint), seed)
    tokens = sampler.sample(MAX_TOKENS)
    assert sampler.done, f"seed {seed}: no end within {MAX_TOKENS} tokens"
    return tokens


def _items(request: ResponsesRequest, tokens: list[int]) -> list[Any]:
    """What a client gets: the Response's output items after our stream translator."""
    response = initial_response(request, response_id=new_response_id(), model=MODEL)
    translator = ResponseStreamTranslator(response, ToolRegistry.from_request(request))
    translator.start()
    translator.feed(tokens)
    events = translator.finish("stop", prompt_tokens=1, cached_tokens=0)
    assert events[-1].type == "response.completed"
    return list(translator.response.output)


def _harmony_messages(tokens: list[int]) -> list[Any]:
    return ENCODING.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)


def _validate(text: str, schema: dict[str, Any]) -> None:
    jsonschema.validate(json.loads(text), schema)


# --- the vocabulary -------------------------------------------------------------------------


def test_tokenizer_matches_harmony_encoding() -> None:
    tokenizer = harmony_tokenizer()
    texts = [
        '<|channel|>final<|message|>Hello, wörld! {"a": 1}<|return|>',
        "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json",
        "数学  123456 it's\n\n\t  x<|end|><|call|>",
    ]
    for text in texts:
        assert tokenizer.tokenize_str(text, parse_special=True) == ENCODING.encode(
            text, allowed_special="all"
        )
    assert tokenizer.vocab_size == 201089  # harmony's specials go up to <|reserved_201088|>
    for token in (200002, 200003, 200005, 200006, 200007, 200008, 200012):
        assert tokenizer.is_special_token(token)
    assert tokenizer.decode_str([200005, 200008]) == "<|channel|><|message|>"


# --- building the constraint from a request -------------------------------------------------


def test_nothing_to_enforce_gives_no_constraint() -> None:
    assert constraint_of(_request()) is None
    assert constraint_of(_request(tools=[_tools()[2]])) is None
    loose = {"format": {"type": "json_schema", "name": "p", "schema": SCHEMAS["person"]}}
    assert constraint_of(_request(text=loose)) is None


def test_constraint_from_request() -> None:
    auto = constraint_of(_request(tools=_tools(), text=_json_format("person")))
    assert auto is not None and auto.final is not None and auto.final.kind == "json"
    recipients = [(call.recipient, call.body.kind) for call in auto.tool_calls]
    assert recipients == [
        ("functions.exec_command", "json"),
        ("people.add_person", "json"),
        ("functions.note", "text"),
    ]
    required = constraint_of(_request(tools=_tools(), tool_choice="required"))
    assert required is not None and required.final is None and len(required.tool_calls) == 3
    named = constraint_of(
        _request(tools=_tools(), tool_choice={"type": "function", "name": "note"})
    )
    assert named is not None and [call.recipient for call in named.tool_calls] == ["functions.note"]
    none = constraint_of(_request(tools=_tools(), tool_choice="none"))
    assert none == spec.CompletionConstraint(final=spec.FREE, tool_calls=())
    json_object = constraint_of(_request(text={"format": {"type": "json_object"}}))
    assert json_object is not None and json_object.final == spec.Body.json_schema(
        {"type": "object"}
    )


def test_grammar_is_deterministic_and_cached() -> None:
    request = _request(tools=_tools(), text=_json_format("math"))
    first, second = constraint_of(request), constraint_of(request)
    assert first == second and first is not None
    assert to_lark(first) == to_lark(second)
    new_matcher(first)
    hits = cache_info().hits
    new_matcher(second)
    assert cache_info().hits == hits + 1


def test_bad_grammar_is_a_constraint_error() -> None:
    with pytest.raises(ConstraintError):
        compile_grammar("start: undefined_rule\n")


# --- sampling under the mask: valid by construction ----------------------------------------


@pytest.mark.parametrize("name", ["person", "math"])
def test_final_answers_validate(name: str) -> None:
    request = _request(text=_json_format(name), tool_choice="none")
    for seed in SEEDS:
        tokens = _draw(request, seed)
        assert tokens[-1] == RETURN_TOKEN
        messages = _harmony_messages(tokens)
        assert [m.channel for m in messages[:-1]] == ["analysis"] * (len(messages) - 1)
        assert messages[-1].channel == "final"
        items = _items(request, tokens)
        assert [item.type for item in items[:-1]] == ["reasoning"] * (len(items) - 1)
        assert items[-1].type == "message"
        _validate(items[-1].content[0].text, SCHEMAS[name])


def test_required_tool_calls_validate() -> None:
    request = _request(tools=_tools(), tool_choice="required")
    schemas = {"exec_command": SCHEMAS["exec"], "add_person": SCHEMAS["person"]}
    called = set()
    for seed in SEEDS:
        tokens = _draw(request, seed)
        assert tokens[-1] == CALL_TOKEN
        call = _items(request, tokens)[-1]
        assert call.type == "function_call"
        called.add(call.name)
        if call.name in schemas:
            _validate(call.arguments, schemas[call.name])
    assert called == {"exec_command", "add_person", "note"}


def test_auto_ends_in_an_answer_or_a_call_that_validates() -> None:
    request = _request(tools=_tools()[:2], text=_json_format("math"))
    kinds = set()
    for seed in SEEDS:
        last = _items(request, _draw(request, seed))[-1]
        kinds.add(last.type)
        if last.type == "message":
            _validate(last.content[0].text, SCHEMAS["math"])
        else:
            schema = SCHEMAS["exec"] if last.name == "exec_command" else SCHEMAS["person"]
            _validate(last.arguments, schema)
    assert kinds == {"message", "function_call"}


def test_named_tool_choice_calls_only_that_tool() -> None:
    request = _request(tools=_tools(), tool_choice={"type": "function", "name": "exec_command"})
    for seed in range(20):
        call = _items(request, _draw(request, seed))[-1]
        assert (call.type, call.name) == ("function_call", "exec_command")
        _validate(call.arguments, SCHEMAS["exec"])


def test_regex_custom_tool_input_matches() -> None:
    pattern = r"(ls|cat) /[a-z]{1,8}(/[a-z]{1,8})?"
    tool = {
        "type": "custom",
        "name": "run",
        "format": {"type": "grammar", "syntax": "regex", "definition": pattern},
    }
    request = _request(tools=[tool], tool_choice="required")
    for seed in range(20):
        call = _items(request, _draw(request, seed))[-1]
        assert call.type == "custom_tool_call"
        assert re.fullmatch(pattern, call.input), call.input


def test_codex_apply_patch_grammar() -> None:
    """Codex's own lark grammar, as it sends it, nested in the harmony grammar."""
    lark = pytest.importorskip("lark")
    body = json.loads(CODEX_PATCH_REQUEST.read_text())
    body = body.get("body", body)
    [tool] = [tool for tool in body["tools"] if tool.get("type") == "custom"]
    definition = tool["format"]["definition"]
    # The lark package refuses the zero-width /(.*)/ (llguidance takes it): an equivalent.
    parser = lark.Lark(definition.replace("/(.*)/", "/(.+)/?"))
    request = _request(tools=[tool], tool_choice="required")
    constraint = constraint_of(request)
    assert constraint is not None
    parsed = 0
    for seed in range(30):
        sampler = MaskedSampler(new_matcher(constraint), seed)
        tokens = sampler.sample(MAX_TOKENS)
        if not sampler.done:
            continue  # random patches can run long; what ends must parse
        call = _items(request, tokens)[-1]
        assert call.type == "custom_tool_call" and call.name == "apply_patch"
        parser.parse(call.input)
        parsed += 1
    assert parsed >= 10
