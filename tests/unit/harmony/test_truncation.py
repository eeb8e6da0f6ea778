"""Truncation's units (serve_app/harmony/truncation.py): a tool search is dropped with its
output, so a kept output never lacks its call and the tools it loaded go together."""

from __future__ import annotations

from serve_app.harmony.truncation import _droppable_units
from serve_app.protocol.requests import ResponsesRequest

ITEMS = [
    {"role": "user", "content": "first"},
    {"type": "tool_search_call", "call_id": "s1", "execution": "client", "arguments": {}},
    {"type": "tool_search_output", "call_id": "s1", "execution": "client", "tools": []},
    {"role": "assistant", "content": "found"},
    {"role": "user", "content": "last"},
]


def test_a_tool_search_is_dropped_with_its_output() -> None:
    items = ResponsesRequest.model_validate({"model": "m", "input": ITEMS}).input_items
    assert _droppable_units(items) == [[0], [1, 2], [3]]
