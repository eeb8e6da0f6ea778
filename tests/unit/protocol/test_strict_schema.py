"""The request-time strict-schema check (issue 20): schemas the real clients generate for
``strict: true`` pass, schemas OpenAI's Structured Outputs would refuse are a 400 naming the
param, and tools without ``strict: true`` are never checked."""

from __future__ import annotations

import copy
import enum
from typing import Any

import agents
import openai
import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field

from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.strict_schema import StrictSchemaError, check_schema
from serve_app.serving.admission.tools import check_strict_schemas as check_request
from tests.support import MODEL
from tests.support.helpers import in_process_api, node_json, sdk_client


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    street: str = Field(description="Street and number")
    city: str


class TreeNode(BaseModel):
    label: str
    children: list[TreeNode]


class Person(BaseModel):
    name: str
    age: int | None = None
    address: Address = Field(description="Where they live")
    previous: list[Address]
    favourite: Color
    tree: TreeNode


@agents.function_tool
def find_person(person: Person, limit: int | None = None, tags: list[str] | None = None) -> str:
    """Find a person like this one."""
    return ""


# OpenAI's own examples (Structured Outputs, "Supported schemas"): root and $defs recursion.
RECURSIVE_ROOT = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["div", "button"]},
        "children": {"type": "array", "items": {"$ref": "#"}},
    },
    "required": ["type", "children"],
    "additionalProperties": False,
}
LINKED_LIST = {
    "type": "object",
    "properties": {"linked_list": {"$ref": "#/$defs/node"}},
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "number"},
                "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
            },
            "additionalProperties": False,
            "required": ["next", "value"],
        }
    },
    "additionalProperties": False,
    "required": ["linked_list"],
}

GOOD = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "n": {"type": ["integer", "null"]}},
    "required": ["q", "n"],
    "additionalProperties": False,
}


def _obj(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
        **extra,
    }


def _nested(levels: int) -> dict[str, Any]:
    """``levels`` objects, each the only property of the one above it."""
    schema = _obj({"leaf": {"type": "string"}})
    for _ in range(levels - 1):
        schema = _obj({"child": schema})
    return schema


# --- what real clients generate passes ------------------------------------------------------


def _client_schemas() -> dict[str, dict[str, Any]]:
    return {
        "pydantic_function_tool": openai.pydantic_function_tool(Person)["function"]["parameters"],
        "to_strict_json_schema": to_strict_json_schema(Person),
        "agents_function_tool": find_person.params_json_schema,
        "recursive_root": RECURSIVE_ROOT,
        "linked_list": LINKED_LIST,
        "ten_levels": _nested(10),
    }


@pytest.mark.parametrize("name", list(_client_schemas()))
def test_client_strict_schemas_pass(name: str) -> None:
    check_schema(_client_schemas()[name])


def test_agents_sdk_tools_are_strict_by_default() -> None:
    # Why its schemas matter here: it sends them with strict: true unless told otherwise.
    assert find_person.strict_json_schema is True


ZOD_SCRIPT = """
import { z } from "zod";
import { zodSchema } from "ai";
const Item = z.object({ x: z.enum(["a", "b"]), note: z.string().nullable() });
const schema = z.object({
  name: z.string(), age: z.number().int().nullable(), items: z.array(Item), kind: z.literal("k"),
});
console.log(JSON.stringify(await zodSchema(schema).jsonSchema));
"""


def test_zod_schema_through_the_ai_sdk_passes() -> None:
    schema = node_json(ZOD_SCRIPT, needs="ai")
    assert schema["additionalProperties"] is False
    check_schema(schema)


# --- what OpenAI refuses fails, naming where ------------------------------------------------


def _bad_schemas() -> dict[str, tuple[Any, tuple[str, ...], str]]:
    """name -> (schema, context, words of the message)."""
    no_additional = _obj({"a": {"type": "object", "properties": {}, "required": []}})
    not_required = _obj({"a": {"type": "string"}, "b": {"type": "string"}})
    not_required["required"] = ["a"]
    extra_required = _obj({"a": {"type": "string"}})
    extra_required["required"] = ["a", "zzz"]
    return {
        "missing additionalProperties": (
            no_additional,
            ("properties", "a"),
            "'additionalProperties' is required to be supplied and to be false",
        ),
        "additionalProperties true at the root": (
            {**GOOD, "additionalProperties": True},
            (),
            "'additionalProperties' is required",
        ),
        "property not in required": (not_required, (), "Missing 'b'"),
        "extra required key": (extra_required, (), "Extra required key 'zzz'"),
        "allOf": (
            _obj({"a": {"allOf": [{"type": "string"}]}}),
            ("properties", "a"),
            "'allOf' is not permitted",
        ),
        "not": (
            _obj({"a": {"type": "string", "not": {"const": "x"}}}),
            ("properties", "a"),
            "'not'",
        ),
        "if/then": (
            _obj({"a": {"type": "string", "if": {}, "then": {}}}),
            ("properties", "a"),
            "'if' is not permitted",
        ),
        "uniqueItems": (
            _obj({"a": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}),
            ("properties", "a"),
            "'uniqueItems' is not permitted",
        ),
        "array root": ({"type": "array", "items": {"type": "string"}}, (), "got 'type: \"array\"'"),
        "anyOf root": ({"anyOf": [GOOD, {"type": "null"}]}, (), 'type: "object"'),
        "too deep": (_nested(11), ("properties", "child") * 10, "more than 10 levels"),
        "untyped property": (_obj({"a": {}}), ("properties", "a"), "must have a 'type' key"),
        "unknown type": (_obj({"a": {"type": "date"}}), ("properties", "a"), "'date'"),
        "array without items": (
            _obj({"a": {"type": "array"}}),
            ("properties", "a"),
            "missing items",
        ),
        "dangling $ref": (_obj({"a": {"$ref": "#/$defs/nope"}}), ("properties", "a"), "nope"),
        "bad definition": (
            {**LINKED_LIST, "$defs": {"node": {"type": "object", "properties": {}}}},
            ("$defs", "node"),
            "'additionalProperties'",
        ),
        "bad anyOf branch": (
            _obj({"a": {"anyOf": [{"type": "string"}, {"type": "object"}]}}),
            ("properties", "a", "anyOf", "1"),
            "'additionalProperties'",
        ),
        "too many enum values": (
            _obj({f"e{i}": {"type": "integer", "enum": list(range(101))} for i in range(10)}),
            (),
            "too many enum values: 1010 > 1000",
        ),
        "too many properties": (
            _obj({f"p{i}": {"type": "string"} for i in range(5001)}),
            (),
            "too many object properties",
        ),
    }


@pytest.mark.parametrize("name", list(_bad_schemas()))
def test_schemas_outside_the_strict_subset_fail(name: str) -> None:
    schema, context, words = _bad_schemas()[name]
    with pytest.raises(StrictSchemaError) as caught:
        check_schema(schema)
    assert caught.value.context == context
    assert words in str(caught.value)


# --- where the request names the schema -----------------------------------------------------

BAD = _obj({"a": {"type": "object", "properties": {}}})
STRICT_TOOL = {"type": "function", "name": "ok", "strict": True, "parameters": GOOD}


def _error(**fields: Any) -> InvalidRequest:
    request = ResponsesRequest.model_validate({"model": MODEL, "input": "hi", **fields})
    with pytest.raises(InvalidRequest) as caught:
        check_request(request)
    return caught.value


def test_a_strict_flat_tool_is_named_by_index() -> None:
    bad = {"type": "function", "name": "lookup", "strict": True, "parameters": BAD}
    error = _error(tools=[STRICT_TOOL, {"type": "web_search"}, bad])
    assert error.param == "tools[2].parameters"
    assert error.code == "invalid_function_parameters"
    assert error.message == (
        "Invalid schema for function 'lookup': In context=('properties', 'a'),"
        " 'additionalProperties' is required to be supplied and to be false."
    )


def test_a_strict_chat_completions_tool_is_named_under_function() -> None:
    nested = {"type": "function", "function": {"name": "f", "strict": True, "parameters": BAD}}
    assert _error(tools=[nested]).param == "tools[0].function.parameters"


def test_a_strict_tool_in_a_namespace_is_named_inside_it() -> None:
    namespace = {
        "type": "namespace",
        "name": "docs",
        "tools": [
            {"type": "custom", "name": "note"},
            {"type": "function", "name": "f", "strict": True, "parameters": BAD},
        ],
    }
    assert _error(tools=[STRICT_TOOL, namespace]).param == "tools[1].tools[1].parameters"


def test_a_strict_json_schema_format_is_named() -> None:
    text = {"format": {"type": "json_schema", "name": "answer", "strict": True, "schema": BAD}}
    error = _error(text=text)
    assert error.param == "text.format.schema"
    assert error.message.startswith("Invalid schema for response_format 'answer': ")


@pytest.mark.parametrize("strict", [False, None])
def test_schemas_not_asked_strict_are_not_checked(strict: bool | None) -> None:
    # Codex and the AI SDK send strict: false with free-form schemas.
    tool: dict[str, Any] = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    fmt: dict[str, Any] = {"type": "json_schema", "name": "a", "schema": {"type": "array"}}
    if strict is not None:
        tool["strict"] = fmt["strict"] = strict
    nested = {"type": "function", "function": copy.deepcopy(tool)}
    request = ResponsesRequest.model_validate(
        {"model": MODEL, "input": "hi", "tools": [tool, nested], "text": {"format": fmt}}
    )
    check_request(request)


# --- end to end through the openai SDK ------------------------------------------------------


async def test_the_sdk_gets_a_400_naming_the_tool(tmp_path) -> None:
    bad = {"type": "function", "name": "lookup", "strict": True, "parameters": BAD}
    async with in_process_api(tmp_path / "strict.db") as api:
        client = sdk_client(api)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model=MODEL, input="hi", tools=[STRICT_TOOL, bad])
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "tools[1].parameters"
    assert "'additionalProperties' is required" in error["message"]


async def test_client_strict_tools_and_parse_are_accepted(tmp_path) -> None:
    tools: list[Any] = [
        {"type": "function", "name": "find_person", "strict": True},
        {"type": "function", "name": "person", "strict": True},
    ]
    tools[0]["parameters"] = find_person.params_json_schema
    tools[1]["parameters"] = openai.pydantic_function_tool(Person)["function"]["parameters"]
    async with in_process_api(tmp_path / "strict.db") as api:
        client = sdk_client(api)
        response = await client.responses.create(model=MODEL, input="hi", tools=tools)
        assert response.status == "completed"
        try:
            parsed = await client.responses.parse(model=MODEL, input="hi", text_format=Person)
        except openai.BadRequestError:
            raise
        except Exception as error:  # the simulated engine's placeholder is not a Person
            assert "validation error" in str(error).lower() or "json" in str(error).lower()
        else:
            assert parsed.status == "completed"
