"""Breakpoints land where their content part ends in the rendered prompt (issue 40)."""

from __future__ import annotations

from datetime import UTC, datetime

from serve_app.harmony.cache_breakpoints import breakpoint_positions
from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from tests.support import MODEL
from tests.support.helpers import decode

NOW = datetime(2026, 1, 1, tzinfo=UTC)
MARK = {"mode": "explicit"}


def rendered(input_items: list[dict], **fields) -> tuple[ResponsesRequest, list[int]]:
    request = ResponsesRequest.model_validate({"model": MODEL, "input": input_items, **fields})
    return request, render_request(request, now=NOW).token_ids


def part(text: str, marked: bool = False) -> dict:
    return {
        "type": "input_text",
        "text": text,
        **({"prompt_cache_breakpoint": MARK} if marked else {}),
    }


def test_each_marked_part_ends_its_prefix() -> None:
    items = [
        {"role": "user", "content": [part("The manual, chapter one. ", True), part("Question?")]},
        {"role": "assistant", "content": "An answer."},
        {"role": "user", "content": [part("Chapter two of it. ", True), part("More?", True)]},
    ]
    request, token_ids = rendered(items)
    positions = breakpoint_positions(token_ids, request.input_items)
    assert len(positions) == 3 and positions == sorted(positions)
    ends = [decode(token_ids[:position]) for position in positions]
    # The space ending a part is tokenized with the next part's first word (" Question"): the
    # prefix stops before that token, which the part does not hold whole.
    assert ends[0].endswith("<|message|>The manual, chapter one.")
    assert ends[1].endswith("<|message|>Chapter two of it.")
    assert ends[2].endswith("Chapter two of it. More?")  # the message's whole text, no <|end|>


def test_the_same_text_twice_marks_the_later_message() -> None:
    items = [
        {"role": "user", "content": "Same words."},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": [part("Same words.", True)]},
    ]
    request, token_ids = rendered(items)
    [position] = breakpoint_positions(token_ids, request.input_items)
    assert decode(token_ids[:position]).count("Same words.") == 2


def test_a_mark_in_the_instructions_ends_inside_the_developer_message() -> None:
    items = [
        {"role": "developer", "content": [part("Always answer in French.", True)]},
        {"role": "user", "content": "Bonjour"},
    ]
    request, token_ids = rendered(items)
    [position] = breakpoint_positions(token_ids, request.input_items)
    assert decode(token_ids[:position]).endswith("Always answer in French.")


def test_no_mark_no_position_and_a_message_not_rendered_marks_nothing() -> None:
    request, token_ids = rendered([{"role": "user", "content": [part("Plain.")]}])
    assert breakpoint_positions(token_ids, request.input_items) == []
    # A message the prompt no longer holds (truncated away): nothing to mark.
    other, _ = rendered([{"role": "user", "content": [part("Not in that prompt.", True)]}])
    assert breakpoint_positions(token_ids, other.input_items) == []
