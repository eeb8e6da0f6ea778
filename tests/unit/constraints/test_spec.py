"""What is enforced where the Responses API leaves a choice to the server (issue 20):

- a function tool with ``strict`` omitted: enforced when its schema is already in OpenAI's
  strict subset, best effort (never a 400) otherwise;
- ``tool_choice: {"type": "allowed_tools"}``: only those tools may be called, ``required``
  mode must call one, and every tool is still rendered;
- tool calls only on the commentary channel, never from analysis;
- a schema or grammar llguidance cannot compile: a 400 naming the param; a sampler dead end:
  a server error saying so;
- the vLLM engine's side: structured outputs on the guidance backend from token 0, no
  unconstrained fallback, a token the grammar forbids fails the request.

Through the openai SDK against the in-process app (simulated engine, sampling under the mask)
where the behaviour is the app's; at the unit level for the engine's config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openai import BadRequestError

from serve_app.constraints import build, spec
from serve_app.constraints.grammar import to_lark
from serve_app.constraints.matcher import compile_grammar, new_matcher
from serve_app.constraints.sampling import MaskedSampler, TokenMask
from serve_app.constraints.vocab import harmony_tokenizer
from serve_app.engines.base import EngineError
from serve_app.engines.simulated.steps import Sample as _Sample
from serve_app.engines.vllm_engine import VLLMEngine, VLLMEngineConfig, _ConstraintCheck
from serve_app.harmony.encoding import get_encoding
from serve_app.harmony.render import render_request
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.requests import ResponsesRequest
from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client


def constraint_of(request: ResponsesRequest) -> spec.CompletionConstraint | None:
    """The request's constraint, its tools as the door builds them (no history here)."""
    return build.from_request(request, ToolRegistry.from_request(request))


ENCODING = get_encoding()
END = ENCODING.encode("<|end|>", allowed_special="all")[0]
STRICT_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
# Not in the strict subset: `days` is optional.
LOOSE_SCHEMA = {**STRICT_SCHEMA, "required": ["city"]}
LOOK_BEHIND = {
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}},
    "required": ["a"],
    "additionalProperties": False,
}


def _tool(name: str, schema: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": schema, **fields}


def _request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": MODEL, "input": "go", **fields})


def _allowed(mode: str, *names: str) -> dict[str, Any]:
    tools = [{"type": "function", "name": name} for name in names]
    return {"type": "allowed_tools", "mode": mode, "tools": tools}


def _text(tokens: list[int]) -> str:
    return ENCODING.decode(tokens)


# --- strict omitted -------------------------------------------------------------------------


def test_strict_omitted_enforces_a_schema_already_strict() -> None:
    constraint = constraint_of(_request(tools=[_tool("trip", STRICT_SCHEMA)]))
    assert constraint is not None
    assert [call.body for call in constraint.tool_calls] == [spec.Body.json_schema(STRICT_SCHEMA)]


def test_strict_omitted_is_best_effort_for_other_schemas() -> None:
    assert constraint_of(_request(tools=[_tool("trip", LOOSE_SCHEMA)])) is None
    # strict: false is never enforced, whatever the schema.
    assert constraint_of(_request(tools=[_tool("trip", STRICT_SCHEMA, strict=False)])) is None


async def test_strict_omitted_calls_validate_and_loose_schemas_are_no_400(tmp_path: Path) -> None:
    async with in_process_api(tmp_path / "strict.db") as api:
        client = sdk_client(api)
        for seed in range(20):
            response = await client.responses.create(
                model=MODEL,
                input=f"Trip {seed}",
                tools=[_tool("trip", STRICT_SCHEMA)],  # type: ignore[list-item]
                tool_choice="required",
            )
            calls = [item for item in response.output if item.type == "function_call"]
            assert len(calls) == 1, response.output
            jsonschema.validate(json.loads(calls[0].arguments), STRICT_SCHEMA)
        loose = await client.responses.create(
            model=MODEL,
            input="hi",
            tools=[_tool("trip", LOOSE_SCHEMA)],  # type: ignore[list-item]
        )
        assert loose.status == "completed"
        assert loose.tools[0].strict is True  # echoed with the Responses default, as OpenAI does


# --- allowed_tools --------------------------------------------------------------------------


def test_allowed_tools_limit_the_calls_and_keep_every_tool_rendered() -> None:
    tools = [_tool("a", STRICT_SCHEMA), _tool("b", LOOSE_SCHEMA), _tool("c", LOOSE_SCHEMA)]
    required = _request(tools=tools, tool_choice=_allowed("required", "a", "b"))
    constraint = constraint_of(required)
    assert constraint is not None and constraint.final is None
    assert [call.recipient for call in constraint.tool_calls] == ["functions.a", "functions.b"]
    prompt = render_request(required)
    assert [tool.name for tool in prompt.tools.tools] == ["a", "b", "c"]
    assert "You may call only these tools: `a`, `b`." in _text(prompt.token_ids)
    # auto: an answer or a call to `b`, even though no tool is strict.
    auto = constraint_of(_request(tools=tools[1:], tool_choice=_allowed("auto", "b")))
    assert auto is not None and auto.final == spec.FREE
    assert [call.recipient for call in auto.tool_calls] == ["functions.b"]


async def test_allowed_tools_required_calls_only_those(tmp_path: Path) -> None:
    tools = [_tool(name, STRICT_SCHEMA, strict=True) for name in ("a", "b", "c")]
    async with in_process_api(tmp_path / "allowed.db") as api:
        client = sdk_client(api)
        names = set()
        for seed in range(30):
            response = await client.responses.create(
                model=MODEL,
                input=f"Task {seed}",
                tools=tools,  # type: ignore[arg-type]
                tool_choice=_allowed("required", "b", "c"),  # type: ignore[arg-type]
            )
            calls = [item for item in response.output if item.type == "function_call"]
            assert len(calls) == 1 and calls[0].name in {"b", "c"}, response.output
            names.add(calls[0].name)
            assert response.tool_choice.type == "allowed_tools"  # echoed as sent
        assert names == {"b", "c"}


@pytest.mark.parametrize(
    ("tool_choice", "param"),
    [
        (_allowed("required", "missing"), "tool_choice"),
        ({**_allowed("required", "a"), "mode": "sometimes"}, "tool_choice.mode"),
        ({"type": "allowed_tools", "mode": "auto"}, "tool_choice.tools"),
        ({**_allowed("auto"), "tools": [{"type": "function"}]}, "tool_choice.tools[0].name"),
    ],
)
async def test_malformed_allowed_tools_are_a_400(
    tmp_path: Path, tool_choice: dict[str, Any], param: str
) -> None:
    async with in_process_api(tmp_path / "bad_allowed.db") as api:
        with pytest.raises(BadRequestError) as raised:
            await sdk_client(api).responses.create(
                model=MODEL,
                input="hi",
                tools=[_tool("a", STRICT_SCHEMA)],  # type: ignore[list-item]
                tool_choice=tool_choice,  # type: ignore[arg-type]
            )
    assert raised.value.body["param"] == param  # type: ignore[index]


# --- calls on analysis ----------------------------------------------------------------------


def test_no_call_from_the_analysis_channel() -> None:
    """The stream translator would read a recipient on analysis as a call; the grammar never
    lets one be written there: calls go on commentary, as gpt-oss writes function calls."""
    request = _request(tools=[_tool("a", STRICT_SCHEMA, strict=True)], tool_choice="required")
    constraint = constraint_of(request)
    assert constraint is not None
    matcher = new_matcher(constraint)
    header = ENCODING.encode("<|channel|>analysis", allowed_special="all")
    for token in header:
        assert matcher.consume_token(token)
    recipient = ENCODING.encode(" to=functions.a", allowed_special=set())
    assert not matcher.consume_token(recipient[0])


# --- what llguidance cannot compile ---------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "strict": True,
                        "schema": LOOK_BEHIND,
                    }
                }
            },
            "text.format.schema",
        ),
        (
            {"tools": [_tool("f", STRICT_SCHEMA), _tool("g", LOOK_BEHIND, strict=True)]},
            "tools[1].parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "namespace",
                        "name": "ns",
                        "tools": [_tool("g", LOOK_BEHIND, strict=True)],
                    }
                ]
            },
            "tools[0].tools[0].parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "custom",
                        "name": "patch",
                        "format": {"type": "grammar", "syntax": "regex", "definition": "(?<=a)b"},
                    }
                ]
            },
            "tools[0].format.definition",
        ),
        (
            {
                "tools": [
                    {
                        "type": "custom",
                        "name": "patch",
                        "format": {
                            "type": "grammar",
                            "syntax": "lark",
                            "definition": "start: undefined_rule",
                        },
                    }
                ]
            },
            "tools[0].format.definition",
        ),
    ],
    ids=["text-format", "function", "namespace", "regex", "lark"],
)
async def test_what_llguidance_cannot_compile_is_a_400_naming_the_param(
    tmp_path: Path, fields: dict[str, Any], param: str
) -> None:
    async with in_process_api(tmp_path / "compile.db") as api:
        with pytest.raises(BadRequestError, match="cannot enforce") as raised:
            await sdk_client(api).responses.create(model=MODEL, input="hi", **fields)
    assert raised.value.body["param"] == param  # type: ignore[index]


# --- the vLLM engine's side (no vLLM needed) ------------------------------------------------


def test_the_vllm_engine_asks_for_the_guidance_backend_from_the_first_token() -> None:
    args = VLLMEngineConfig(model="m").engine_args()
    assert args["skip_tokenizer_init"] is False
    assert args["structured_outputs_config"] == {"backend": "guidance", "enable_in_reasoning": True}
    bare = VLLMEngineConfig(model="m", skip_tokenizer_init=True).engine_args()
    assert "structured_outputs_config" not in bare
    with pytest.raises(ValueError, match="constrained decoding"):
        VLLMEngineConfig(model="m", engine_kwargs={"structured_outputs_config": {}})
    # A reasoning parser is harmless: enable_in_reasoning applies the grammar from token 0.
    VLLMEngineConfig(model="m", engine_kwargs={"reasoning_parser": "openai_gptoss"})


async def test_a_vllm_engine_without_a_tokenizer_refuses_a_constraint() -> None:
    engine = VLLMEngine(VLLMEngineConfig(model="m", skip_tokenizer_init=True))
    with pytest.raises(EngineError, match="cannot enforce"):
        await engine._constraint_check("start: <|return|>\n")
    assert await engine._constraint_check(None) is None


def test_a_token_the_grammar_forbids_fails_the_request() -> None:
    constraint = constraint_of(_request(text={"format": {"type": "json_object"}}))
    assert constraint is not None
    check = _ConstraintCheck(compile_grammar(to_lark(constraint)))
    check.follow(ENCODING.encode("<|channel|>final<|message|>{", allowed_special="all"))
    with pytest.raises(EngineError, match="constrained decoding failed") as raised:
        check.follow(ENCODING.encode("hello", allowed_special=set()))
    assert raised.value.code == "server_error"


def test_max_free_tokens_ends_each_free_message() -> None:
    constraint = constraint_of(_request(text={"format": {"type": "json_object"}}))
    assert constraint is not None
    matcher = new_matcher(constraint, max_free_tokens=4)
    for token in ENCODING.encode("<|channel|>analysis<|message|>", allowed_special="all"):
        assert matcher.consume_token(token)
    for token in ENCODING.encode(" a b c d", allowed_special=set()):
        assert matcher.consume_token(token)
    mask = TokenMask(matcher)
    assert list(mask.specials()) == [END] and not mask.has_plain()
    # Sampled completions stay valid, and unbounded grammars are unchanged.
    for seed in range(5):
        sampler = MaskedSampler(new_matcher(constraint, max_free_tokens=4), seed)
        sampler.sample(400)
        assert sampler.done
    assert "max_tokens" not in to_lark(constraint)


class _NothingAllowed:
    """A matcher in a dead end: no token allowed, not stopped."""

    def compute_bitmask(self) -> bytes:
        return bytes((harmony_tokenizer().vocab_size + 7) // 8)

    def is_stopped(self) -> bool:
        return False

    def get_error(self) -> str:
        return "stuck"


def test_a_sampler_dead_end_is_a_server_error_saying_so() -> None:
    sample = _Sample(MaskedSampler(_NothingAllowed(), seed=0))  # type: ignore[arg-type]
    with pytest.raises(EngineError, match="constrained decoding reached a dead end") as raised:
        next(iter(sample.tokens))
    assert raised.value.code == "server_error"  # a 500 / response.failed, not the client's 400
