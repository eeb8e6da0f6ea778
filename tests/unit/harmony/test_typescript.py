"""Tool schemas the model can read: the schemas real clients generate (Pydantic, the Agents SDK,
the openai SDK's strict tools, zod 4) reach the prompt with every nested field typed, where
harmony's own renderer wrote ``any``; flat schemas render exactly as harmony renders them."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

import agents
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai_harmony import (
    DeveloperContent,
    Message,
    Role,
    ToolDescription,
    ToolNamespaceConfig,
)
from pydantic import BaseModel, Field

from serve_app.harmony.encoding import get_encoding
from serve_app.harmony.render import render_request
from serve_app.harmony.typescript import NamespaceText, ToolText, schema_text, tools_section
from serve_app.protocol import json_schema as schemas
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.admission import responses as validation
from tests.support import MODEL
from tests.support.helpers import (
    CAPTURES,
    capture_body,
    decode,
    in_process_api,
    node_json,
    sdk_client,
)

NOW = datetime(2026, 11, 22, tzinfo=UTC)


class Color(StrEnum):
    red = "red"
    green = "green"


class Address(BaseModel):
    """A postal address."""

    street: str = Field(description="Street and number")
    city: str


class Person(BaseModel):
    """A person to store."""

    name: str = Field(description="Full name")
    age: int | None = Field(default=None, description="Age in years")
    favourite: Color = Color.green
    address: Address
    previous: list[Address] = Field(default_factory=list, description="Old addresses")
    score: int | str = 3
    level: Literal[1, 2, 3] = 1
    tags: list[int | str] = []


class TreeNode(BaseModel):
    value: int
    children: list[TreeNode] = []


def tool_section(body: dict[str, Any]) -> str:
    """The decoded ``# Tools`` section of the prompt ``body`` renders to, checked first as the
    service checks a request before rendering it."""
    request = ResponsesRequest.model_validate(body)
    validation.check_items(request)
    text = decode(render_request(request, now=NOW).token_ids)
    return text.split("# Tools", 1)[1].split("<|end|>", 1)[0]


def function_tool(parameters: dict[str, Any], name: str = "save") -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": "hi",
        "tools": [
            {"type": "function", "name": name, "description": "Save it.", "parameters": parameters}
        ],
    }


def assert_person_fields(text: str, indent: str = "") -> None:
    """The fields of ``Person`` with their types, wherever the schema generator put them."""
    inner = indent + "    "
    assert f"{indent}// Full name\n{indent}name: string," in text
    assert f"{indent}// Age in years\n{indent}age" in text and "number | null" in text
    assert '"red" | "green"' in text
    assert (
        f"{indent}// A postal address.\n{indent}address: {{\n"
        f"{inner}// Street and number\n{inner}street: string,\n{inner}city: string,\n{indent}}},"
    ) in text
    assert f"{indent}// Old addresses\n{indent}previous" in text
    assert f"{inner}street: string,\n{inner}city: string,\n{indent}}}[]," in text
    assert "number | string" in text or " | number\n" in text
    assert "any" not in text.replace("=> any", "")


def test_pydantic_model_json_schema_renders_every_nested_field() -> None:
    text = tool_section(function_tool(Person.model_json_schema()))
    assert "type save = (_: // A person to store.\n{\n" in text
    assert_person_fields(text)
    # Optional fields are marked, with their defaults; Pydantic's per-field titles are left out.
    assert "age?: number | null, // default: null" in text
    assert "favourite?: " in text and '"red" | "green", // default: green' in text
    assert "previous?: {" in text
    assert "score?:\n | number\n | string\n," in text and "// default: 3" in text
    assert "level?: 1 | 2 | 3, // default: 1" in text
    assert "tags?: (number | string)[], // default: []" in text
    assert "// Name\n//" not in text and "$ref" not in text


def test_agents_sdk_function_tool_schema() -> None:
    @agents.function_tool
    def save_person(person: Person, note: str | None = None) -> str:
        """Save a person.

        Args:
            person: The person to save.
            note: A note for the record.
        """
        return "ok"

    text = tool_section(function_tool(save_person.params_json_schema, name="save_person"))
    assert "// The person to save.\nperson: {\n" in text
    assert_person_fields(text, indent="    ")
    # Strict schemas make every field required, optional ones nullable.
    assert "    age: number | null," in text
    assert "// A note for the record.\nnote: string | null," in text


def test_openai_sdk_strict_pydantic_function_tool() -> None:
    function = openai.pydantic_function_tool(Person, name="save_person")["function"]
    body = function_tool(function["parameters"], name="save_person")
    body["tools"][0]["strict"] = function["strict"]
    text = tool_section(body)
    assert_person_fields(text)
    assert "age: number | null," in text and "previous: {" in text


ZOD_SCRIPT = textwrap.dedent(
    """
    import { z } from "zod";
    const Address = z.object({
      street: z.string().describe("Street and number"),
      city: z.string(),
    }).describe("A postal address.");
    const Person = z.object({
      name: z.string().describe("Full name"),
      age: z.number().int().nullable().describe("Age in years"),
      favourite: z.enum(["red", "green"]).default("green"),
      address: Address,
      previous: z.array(Address).describe("Old addresses"),
      score: z.union([z.number(), z.string()]),
      counts: z.record(z.string(), z.number()),
    });
    const Node = z.object({ value: z.number(), get children() { return z.array(Node); } });
    console.log(JSON.stringify([z.toJSONSchema(Person), z.toJSONSchema(Node)]));
    """
)


@pytest.fixture(scope="module")
def zod_schemas() -> list[dict[str, Any]]:
    return node_json(ZOD_SCRIPT, needs="zod")


def test_zod_schemas_render_every_nested_field(zod_schemas) -> None:
    person, _ = zod_schemas
    text = tool_section(function_tool(person))
    assert_person_fields(text)
    assert "age: number | null," in text
    assert 'favourite: "red" | "green", // default: green' in text
    assert "counts: Record<string, number>," in text


def test_a_recursive_zod_schema_terminates(zod_schemas) -> None:
    _, node = zod_schemas  # {"$ref": "#"} inside
    text = tool_section(function_tool(node))
    assert "value: number,\nchildren: any[],\n}) => any;" in text


def test_a_recursive_pydantic_model_renders_by_name() -> None:
    text = tool_section(function_tool(TreeNode.model_json_schema()))
    assert (
        "type save = (_: {\n// type TreeNode = this object\nvalue: number,\n"
        "children?: TreeNode[], // default: []\n}) => any;"
    ) in text
    resolved = schemas.resolve(TreeNode.model_json_schema())
    assert resolved["properties"]["children"]["items"] == {"$ref": "#/$defs/TreeNode"}
    assert "TreeNode" in resolved["$defs"]


def test_text_format_json_schema_has_its_nested_fields_resolved() -> None:
    body = {
        "model": MODEL,
        "input": "hi",
        "text": {
            "format": {
                "type": "json_schema",
                "name": "person",
                "strict": True,
                "description": "The person in the text.",
                "schema": Person.model_json_schema(),
            }
        },
    }
    text = decode(render_request(ResponsesRequest.model_validate(body), now=NOW).token_ids)
    section = text.split("# Response Formats\n\n## person\n\n// The person in the text.\n")[1]
    schema = json.loads(section.split("<|end|>")[0])
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    address = schema["properties"]["address"]
    assert address["properties"]["street"]["description"] == "Street and number"
    assert schema["properties"]["previous"]["items"]["properties"]["city"] == {
        "title": "City",
        "type": "string",
    }
    assert schema["properties"]["favourite"]["enum"] == ["red", "green"]


# --- what stays exactly as harmony renders it --------------------------------------------


def harmony_tools_section(tools: list[dict[str, Any]]) -> str:
    """openai-harmony's own text for function tools (the renderer we replaced)."""
    content = DeveloperContent.new().with_function_tools(
        [
            ToolDescription.new(t["name"], t.get("description", ""), t.get("parameters"))
            for t in tools
        ]
    )
    rendered = get_encoding().render(Message.from_role_and_content(Role.DEVELOPER, content))
    return decode(rendered).split("<|message|>", 1)[1].removesuffix("<|end|>")


def ours(tools: list[dict[str, Any]]) -> str:
    texts = [
        ToolText(t["name"], t.get("description", ""), schemas.resolve(t.get("parameters")))
        for t in tools
    ]
    return tools_section([NamespaceText("functions", None, texts)])


def _flat(schema: Any) -> bool:
    """No object or array of objects below the top (where harmony misplaces braces)."""
    properties = (schema or {}).get("properties", {})
    return not any(
        "properties" in value or "properties" in (value.get("items") or {})
        for value in properties.values()
    )


def test_flat_codex_tools_render_exactly_as_harmony_renders_them() -> None:
    tools = [
        tool
        for path in CAPTURES
        for tool in capture_body(f"{path.parent.name}/{path.stem}").get("tools", [])
        if tool.get("type") == "function" and _flat(tool.get("parameters"))
    ]
    assert len(tools) >= 10
    assert ours(tools) == harmony_tools_section(tools)


HARMONY_KITCHENSINK = {
    "type": "object",
    "description": "params object",
    "properties": {
        "string": {
            "type": "string",
            "title": "Greeting",
            "description": "A string",
            "examples": ["hello", "world"],
        },
        "string_nullable": {
            "type": "string",
            "nullable": True,
            "description": "A nullable string",
            "default": "the default",
        },
        "string_enum": {"type": "string", "enum": ["a", "b", "c"]},
        "oneof_string_or_number": {
            "oneOf": [
                {"type": "string", "default": "default_string_in_oneof"},
                {"type": "number", "description": "numbers can happen too"},
            ],
            "description": "a oneof",
            "default": 20,
        },
        "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "locations": {"type": "array", "items": {"type": "string"}, "description": "cities"},
        "id": {"type": ["number", "string"], "default": -1},
        "flag": {"type": "boolean", "default": False},
    },
    "required": ["format"],
}


def test_harmonys_own_test_schema_renders_exactly_as_harmony_renders_it() -> None:
    tools = [
        {
            "name": "kitchensink",
            "description": "A function with various complex schemas.",
            "parameters": HARMONY_KITCHENSINK,
        },
        {"name": "no_params", "description": "Multi\nline."},
    ]
    assert ours(tools) == harmony_tools_section(tools)


def test_namespaces_render_in_harmonys_order() -> None:
    # Harmony keeps namespaces in a sorted map: "alpha" comes before "functions".
    lookup = {
        "type": "function",
        "name": "lookup",
        "description": "Look up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    body = function_tool({"type": "object", "properties": {}})
    body["tools"].append(
        {
            "type": "namespace",
            "name": "alpha",
            "description": "Alpha tools.\nTwo lines.",
            "tools": [lookup],
        }
    )
    expected = (
        DeveloperContent.new()
        .with_function_tools(
            [ToolDescription.new("save", "Save it.", body["tools"][0]["parameters"])]
        )
        .with_tools(
            ToolNamespaceConfig(
                name="alpha",
                description="Alpha tools.\nTwo lines.",
                tools=[ToolDescription.new("lookup", "Look up.", lookup["parameters"])],
            )
        )
    )
    rendered = get_encoding().render(Message.from_role_and_content(Role.DEVELOPER, expected))
    assert "# Tools" + tool_section(body) == decode(rendered).split("<|message|>", 1)[
        1
    ].removesuffix("<|end|>")


def test_function_tools_still_go_to_the_commentary_channel() -> None:
    text = decode(
        render_request(
            ResponsesRequest.model_validate(function_tool(Person.model_json_schema())), now=NOW
        ).token_ids
    )
    assert "Calls to these tools must go to the commentary channel: 'functions'." in text
    plain = {"model": MODEL, "input": "hi"}
    text = decode(render_request(ResponsesRequest.model_validate(plain), now=NOW).token_ids)
    assert "Calls to these tools" not in text


# --- schemas.resolve on its own ----------------------------------------------------------


def test_resolve_inlines_refs_with_sibling_keywords_winning() -> None:
    schema = {
        "$defs": {"A": {"type": "object", "description": "def", "properties": {"x": {}}}},
        "properties": {"a": {"$ref": "#/$defs/A", "description": "use"}},
    }
    assert schemas.resolve(schema) == {
        "properties": {"a": {"type": "object", "description": "use", "properties": {"x": {}}}}
    }


def test_resolve_merges_all_of() -> None:
    schema = {
        "definitions": {
            "Base": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
        },
        "allOf": [
            {"$ref": "#/definitions/Base"},
            {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
        ],
        "description": "merged",
    }
    assert schemas.resolve(schema) == {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "description": "merged",
    }


def test_resolve_leaves_data_and_unknown_references_alone() -> None:
    schema = {
        "properties": {
            "remote": {"$ref": "https://example.com/schema.json", "description": "kept"},
            "dangling": {"$ref": "#/$defs/Missing"},
            "data": {"default": {"$ref": "#/not/a/schema"}, "enum": [{"$ref": "x"}]},
        }
    }
    assert schemas.resolve(schema) == {
        "properties": {
            "remote": {"description": "kept"},
            "dangling": {},
            "data": {"default": {"$ref": "#/not/a/schema"}, "enum": [{"$ref": "x"}]},
        }
    }


def test_resolve_bounds_an_exponential_schema() -> None:
    # Each definition uses the next one twice: 2**16 objects if inlined naively, deep enough
    # that only the node budget stops it.
    defs = {
        f"D{i}": {
            "type": "object",
            "properties": {"l": {"$ref": f"#/$defs/D{i + 1}"}, "r": {"$ref": f"#/$defs/D{i + 1}"}},
        }
        for i in range(16)
    }
    root = {"$defs": defs, "$ref": "#/$defs/D0"}
    resolved = schemas.resolve(root, max_depth=100, max_nodes=500)
    assert len(json.dumps(resolved)) < 100_000
    assert len(schema_text(resolved)) < 100_000


def nested_objects(levels: int) -> dict[str, Any]:
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        nested = {"type": "object", "properties": {"a": nested}}
    return nested


def test_a_schema_deeper_than_the_bound_renders_any_past_it() -> None:
    text = tool_section(function_tool(nested_objects(40)))  # 81 levels of JSON
    assert "type save = (_: {\na?: {\n    a?: {" in text
    assert "a?: any," in text and "string" not in text


def test_tool_parameters_harmony_could_not_parse_are_still_a_400() -> None:
    # Harmony's JSON parser took parameters up to 120 levels deep; deeper ones were a 400.
    nested: Any = "x"
    for index in range(119):
        nested = [nested] if index % 2 else {"a": nested}
    assert schemas.nesting_depth({"a": nested}, 200) == 120
    tool_section(function_tool({"a": nested}))
    with pytest.raises(InvalidRequest) as caught:
        tool_section(function_tool({"a": [nested]}))
    assert caught.value.status_code == 400 and "nest deeper than 120" in str(caught.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "properties",
                    "items",
                    "anyOf",
                    "oneOf",
                    "allOf",
                    "$ref",
                    "$defs",
                    "enum",
                    "const",
                    "required",
                    "nullable",
                    "description",
                    "default",
                    "additionalProperties",
                    "title",
                    "x",
                    "#",
                    "prefixItems",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)
refs = st.sampled_from(["#", "#/$defs/x", "#/properties/x", "#/$defs", "#/items/0", "x"])


@settings(max_examples=300, deadline=None)
@given(schema=json_values, pointer=refs)
def test_resolving_and_rendering_any_json_never_raises(schema: Any, pointer: str) -> None:
    if isinstance(schema, dict):
        schema.setdefault("$defs", {"x": {"properties": {"x": {"$ref": pointer}}}})
    text = schema_text(schemas.resolve(schema))
    assert isinstance(text, str)


# --- end to end --------------------------------------------------------------------------


async def test_input_tokens_count_the_nested_fields(tmp_path) -> None:
    tool = function_tool(Person.model_json_schema())["tools"][0]
    flattened = harmony_tools_section([tool])
    assert "address: any," in flattened  # what the model saw before
    async with in_process_api(tmp_path / "schemas.db") as api:
        client = sdk_client(api)
        counted = await client.responses.input_tokens.count(model=MODEL, input="hi", tools=[tool])
        plain = await client.responses.input_tokens.count(model=MODEL, input="hi")
    ours_count = len(get_encoding().encode(ours([tool])))
    assert counted.input_tokens - plain.input_tokens >= ours_count - 5
    assert ours_count > len(get_encoding().encode(flattened)) + 20
