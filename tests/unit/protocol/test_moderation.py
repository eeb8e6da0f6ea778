"""The classifier's answer read robustly, the default policy's categories, and the results as
the openai SDK types ``Response.moderation`` (serve_app/protocol/moderation.py)."""

from __future__ import annotations

import pytest
from openai.types.responses.response import Moderation
from pydantic import ValidationError

from serve_app.protocol.moderation import (
    OPENAI_CATEGORIES,
    UNPARSEABLE,
    Failure,
    ModerationResults,
    Verdict,
    clean,
    combine,
    load_policy,
    parse_answer,
    policy_categories,
)
from serve_app.protocol.requests import ResponsesRequest

CATS = ("harassment", "hate", "violence")
INPUT_MODE = ("moderation", "policy", "input", "mode")


def test_the_shipped_policy_declares_openais_categories() -> None:
    assert policy_categories(load_policy(None)) == OPENAI_CATEGORIES


def test_an_operators_policy_declares_its_own(tmp_path) -> None:
    policy = tmp_path / "policy.md"
    policy.write_text("# Spam\n\n- `spam`: bulk promotion\n- `phishing`: credential theft\n")
    assert policy_categories(load_policy(str(policy))) == ("spam", "phishing")


def test_a_canonical_answer() -> None:
    answer = '{"violation": 1, "categories": {"violence": 0.9, "hate": 0.1}}'
    verdict = parse_answer(answer, CATS, 0.5)
    assert verdict == Verdict(
        {"harassment": 0.0, "hate": 0.1, "violence": 0.9},
        {"harassment": False, "hate": False, "violence": True},
        True,
    )


@pytest.mark.parametrize(
    ("answer", "flagged", "violence"),
    [
        # A code fence and prose around it.
        (
            'Here it is:\n```json\n{"violation": 0, "categories": {"violence": 0.2}}\n```',
            False,
            0.2,
        ),
        # Confidence words and booleans as scores.
        ('{"categories": {"violence": "high"}}', True, 0.9),
        ('{"categories": {"violence": true}}', True, 1.0),
        # A list of the flagged names.
        ('{"violation": 1, "categories": ["violence"]}', True, 1.0),
        # The guide's policy-referencing format.
        ('{"violation": 1, "policy_category": "violence"}', True, 1.0),
        ('{"violation": 0, "policy_category": null}', False, 0.0),
        # Scores out of range are clamped; a stray brace before the object is skipped.
        ('{ not json } {"categories": {"violence": 7}}', True, 1.0),
        # The guide's binary format.
        ("1", True, 0.0),
        ("0", False, 0.0),
    ],
)
def test_answers_read_leniently(answer: str, flagged: bool, violence: float) -> None:
    verdict = parse_answer(answer, CATS, 0.5)
    assert isinstance(verdict, Verdict)
    assert verdict.flagged is flagged
    assert verdict.scores["violence"] == violence
    assert set(verdict.scores) == set(CATS) == set(verdict.categories)


@pytest.mark.parametrize(
    "answer",
    [
        None,
        "",
        "I think the content is fine.",
        "[1, 2, 3]",
        '{"categories": {"violence": "very"}}',
        '{"categories": "violence"}',
        '{"rationale": "no verdict here"}',
        '{"categories": {"violence": NaN}}',
    ],
)
def test_what_cannot_be_read_is_a_failure_never_an_exception(answer: str | None) -> None:
    judgement = parse_answer(answer, CATS, 0.5)
    assert isinstance(judgement, Failure) and judgement.code == UNPARSEABLE


def test_categories_outside_the_policy_are_dropped() -> None:
    verdict = parse_answer('{"categories": {"spam": 1, "hate": 0.7}}', CATS, 0.5)
    assert isinstance(verdict, Verdict)
    assert set(verdict.scores) == set(CATS) and verdict.categories["hate"]


def test_a_violation_without_a_category_still_flags() -> None:
    """Under `block`, a violation the classifier names no category for must not pass."""
    verdict = parse_answer('{"violation": 1, "categories": {}}', CATS, 0.5)
    assert isinstance(verdict, Verdict) and verdict.flagged


def test_without_declared_categories_the_answers_are_the_results() -> None:
    verdict = parse_answer('{"categories": {"spam": 0.8}}', (), 0.5)
    assert verdict == Verdict({"spam": 0.8}, {"spam": True}, True)


def test_windows_combine_flagged_first_then_failures() -> None:
    low = Verdict({"hate": 0.1}, {"hate": False}, False)
    high = Verdict({"hate": 0.8}, {"hate": True}, True)
    failed = Failure("moderation_timeout", "late")
    assert combine([low, high, failed], CATS) == Verdict(
        {"harassment": 0.0, "hate": 0.8, "violence": 0.0},
        {"harassment": False, "hate": True, "violence": False},
        True,
    )
    assert combine([low, failed], CATS) == failed
    assert combine([], CATS) == clean(CATS)


def test_results_are_the_sdks_moderation() -> None:
    results = ModerationResults(
        "gpt-oss-safeguard-20b",
        parse_answer('{"categories": {"violence": 0.9}}', CATS, 0.5),
        Failure("moderation_timeout", "The moderation model did not answer within 5s."),
    )
    dumped = results.response_field().model_dump(mode="json")
    strict = Moderation.model_validate(dumped)
    assert strict.input.type == "moderation_result" and strict.input.flagged
    assert strict.input.category_applied_input_types["violence"] == ["text"]
    assert strict.input.model == "gpt-oss-safeguard-20b"
    assert strict.output.type == "error" and strict.output.code == "moderation_timeout"


@pytest.mark.parametrize(
    ("moderation", "param"),
    [
        ({"policy": {"input": {"mode": "score"}}}, ("moderation", "model")),
        (
            {"model": "m", "policy": {"input": {"mode": "warn"}}},
            ("moderation", "policy", "input", "mode"),
        ),
        ({"model": "m", "policy": {"output": {}}}, ("moderation", "policy", "output", "mode")),
        ({"model": 5}, ("moderation", "model")),
        ("omni-moderation-latest", ("moderation",)),
    ],
)
def test_bad_options_are_refused_naming_the_field(moderation: object, param: tuple) -> None:
    with pytest.raises(ValidationError) as raised:
        ResponsesRequest.model_validate({"model": "x", "input": "hi", "moderation": moderation})
    assert raised.value.errors()[0]["loc"][: len(param)] == param


def test_sides_default_to_score() -> None:
    request = ResponsesRequest.model_validate(
        {"model": "x", "moderation": {"model": "m", "policy": {"output": {"mode": "block"}}}}
    )
    assert request.moderation is not None
    assert (request.moderation.input_mode, request.moderation.output_mode) == ("score", "block")
