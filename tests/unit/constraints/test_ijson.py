"""Constrained JSON numbers are I-JSON (RFC 7493): finite doubles, integers within ±(2^53-1)
unless the schema's own bounds say otherwise (issue 30 part 5).

Before the fix, the simulated engine sampling under a strict schema wrote numbers such as
``-9515642952e791125262476742455271770`` (``-Infinity`` to JSON.parse, ``inf`` to Python's
``float``); the bound lives in the grammar (serve_app/constraints/ijson.py), so vLLM's
``guidance`` backend gets it too. The JS clients' side (zod through the AI SDK's
generateObject and the openai SDK's responses.parse): tests/clients/test_js_numbers.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from serve_app.constraints import ijson
from serve_app.constraints.grammar import to_lark
from serve_app.constraints.spec import Body, CompletionConstraint
from tests.support import MODEL
from tests.support.helpers import in_process_api, sdk_client

SAFE = 2**53 - 1
# Numbers at the top, nested in arrays and objects, in a type list, and values of any type.
SCHEMA = {
    "type": "object",
    "properties": {
        "age": {"type": "number"},
        "count": {"type": "integer"},
        "ratio": {"type": ["number", "null"]},
        "scores": {"type": "array", "items": {"type": "number"}},
        "point": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "either": {"anyOf": [{"type": "number"}, {"type": "array", "items": {"type": "integer"}}]},
    },
    "required": ["age", "count", "ratio", "scores", "point", "either"],
    "additionalProperties": False,
}
ANSWERS = 120


def i_json_problems(value: Any, at: str = "$") -> list[str]:
    """Where ``value`` (parsed JSON) holds a number that is not I-JSON."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{at}: {value}"]
    if isinstance(value, int):
        return [] if abs(value) <= SAFE else [f"{at}: {value}"]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in i_json_problems(item, f"{at}[{i}]")]
    return [p for key, item in value.items() for p in i_json_problems(item, f"{at}.{key}")]


def test_bounds_are_added_only_where_the_schema_sets_none() -> None:
    schema = {
        "type": "object",
        "properties": {
            "free": {"type": "integer"},
            "floor": {"type": "integer", "minimum": 0},
            "own": {"type": "number", "minimum": -5, "exclusiveMaximum": 7.5},
            "pick": {"type": "integer", "enum": [1, 2]},
        },
        "additionalProperties": False,
    }
    out = ijson.bounded(schema)["properties"]
    assert out["free"] == {"type": "integer", "minimum": -SAFE, "maximum": SAFE}
    assert out["floor"] == {"type": "integer", "minimum": 0, "maximum": SAFE}
    assert out["own"] == {"type": "number", "minimum": -5, "exclusiveMaximum": 7.5}
    assert out["pick"] == {"type": "integer", "enum": [1, 2]}
    assert schema["properties"]["free"] == {"type": "integer"}  # the client's schema untouched
    # What llguidance is given (and vLLM's guidance backend with it) carries the bounds.
    grammar = to_lark(CompletionConstraint(final=Body.json_schema(schema)))
    assert f'"maximum": {SAFE}' in grammar


def test_a_value_of_any_type_is_an_i_json_value() -> None:
    out = ijson.bounded({"type": "object"})
    any_value = out["$defs"]["serve_app_ijson_value"]["anyOf"]
    numbers = [branch for branch in any_value if branch.get("type") == "number"]
    assert numbers == [{"type": "number", "minimum": -SAFE, "maximum": SAFE}]
    assert out["additionalProperties"] == {"$ref": "#/$defs/serve_app_ijson_value"}


@pytest.mark.parametrize(
    ("name", "schema"),
    [("strict", SCHEMA), ("json_object", None)],
)
async def test_sampled_answers_parse_to_finite_numbers(
    tmp_path: Path, name: str, schema: dict[str, Any] | None
) -> None:
    """Many unscripted answers through the openai SDK: each parses with ``json.loads`` into
    finite floats and safe integers, and a strict one still matches its schema."""
    if schema is None:
        text: dict[str, Any] = {"format": {"type": "json_object"}}
    else:
        text = {"format": {"type": "json_schema", "name": name, "strict": True, "schema": schema}}
    numbers: list[Any] = []
    async with in_process_api(tmp_path / "ijson.db") as api:
        client = sdk_client(api)
        for index in range(ANSWERS):
            # The simulated engine seeds its sampler with the prompt: each input, a new answer.
            response = await client.responses.create(
                model=MODEL, input=f"Numbers, please ({name} {index}).", text=text, store=False
            )
            assert response.status == "completed", response.error
            value = json.loads(response.output_text)
            assert i_json_problems(value) == [], response.output_text
            if schema is not None:
                jsonschema.validate(value, schema)
            numbers += _numbers(value)
    # The sweep met numbers to judge (json_object's values are numbers some of the time).
    assert len(numbers) >= ANSWERS // 4


def _numbers(value: Any) -> list[Any]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int | float):
        return [value]
    items = value.values() if isinstance(value, dict) else value
    return [number for item in items for number in _numbers(item)]
