"""Constrained numbers a JavaScript client parses (issue 30 part 5): the AI SDK's
generateObject and the openai JS SDK's responses.parse, each validating with zod (which
refuses the -Infinity that JSON.parse made of ``-9515642952e791125262476742455271770``), over
many unscripted strict answers (tests/js/context_and_numbers_scenarios.mjs ``numbers``). The
grammar's side: tests/unit/constraints/test_ijson.py."""

from __future__ import annotations

from tests.support import js_scenarios


def test_zod_parses_every_constrained_answer(app_url: str) -> None:
    """The AI SDK's generateObject and the openai JS SDK's responses.parse, each validating
    with zod (which refuses ±Infinity), over many unscripted strict answers."""
    output = js_scenarios.run(
        "context_and_numbers_scenarios.mjs", "numbers", app_url, NUMBERS_ANSWERS="40"
    )
    result = output["result"]
    assert result["answers"] == 80 and result["numbers"] >= 80 * 5
    assert result["allFinite"] and result["integersSafe"] and result["strict"]
