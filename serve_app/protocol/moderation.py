"""``moderation``: the request's options as the openai SDK types them, the classifier's answer
read robustly, and the Response's ``moderation`` results.

The request names a moderation model and, per side (``input``, ``output``), a mode: ``score``
(results only) or ``block`` (a flagged side ends the response ``incomplete`` with reason
``content_filter``). A side left out is scored: the SDK's ``Response.moderation`` holds a
result (or an error) for both sides whenever moderation was asked for.

The classifier (gpt-oss-safeguard, serve_app/serving/moderation.py) answers in the format its
policy defines; the shipped policy (``moderation_policy.md`` beside this module) asks for one
JSON object, ``{"violation": 0|1, "categories": {"<category>": <score 0..1>, ...}}``. What it
answers is read here and never trusted: anything that is not such an answer is a `Failure`
(the SDK's ``error`` result), never an exception. No harmony, no Ray.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from openai.types.responses.response import Moderation
from pydantic import Field

from serve_app.protocol.request_base import Lenient

logger = logging.getLogger(__name__)

ModerationMode = Literal["score", "block"]
DEFAULT_MODE: ModerationMode = "score"

# OpenAI's moderation categories, as the SDK's `Moderation.categories` names them: what the
# shipped policy asks the classifier to score.
OPENAI_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
DEFAULT_POLICY = "moderation_policy.md"

# Error codes of a side that could not be judged (the SDK types `code` as a string).
TIMEOUT = "moderation_timeout"
FAILED = "moderation_failed"
UNPARSEABLE = "moderation_unparseable"
UNAVAILABLE = "moderation_unavailable"
INCOMPLETE = "moderation_incomplete"


# --- the request ---------------------------------------------------------------------------


class ModerationSide(Lenient):
    """``moderation.policy.input`` or ``.output``: ``mode`` is required (the SDK's)."""

    mode: ModerationMode


class ModerationPolicy(Lenient):
    input: ModerationSide | None = None
    output: ModerationSide | None = None


class ModerationOptions(Lenient):
    """The request's ``moderation``: ``model`` is required (the SDK's), ``policy`` optional."""

    model: str = Field(min_length=1)
    policy: ModerationPolicy | None = None

    @property
    def input_mode(self) -> ModerationMode:
        side = self.policy.input if self.policy else None
        return side.mode if side else DEFAULT_MODE

    @property
    def output_mode(self) -> ModerationMode:
        side = self.policy.output if self.policy else None
        return side.mode if side else DEFAULT_MODE


# --- judgements ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One judgement: each category of the policy flagged or not, with its score."""

    scores: dict[str, float]
    categories: dict[str, bool]
    flagged: bool


@dataclass(frozen=True)
class Failure:
    """A side that could not be judged: the SDK's ``{"type": "error", code, message}``."""

    code: str
    message: str


Judgement = Verdict | Failure


def clean(categories: tuple[str, ...]) -> Verdict:
    """Nothing to judge (no text): every category unflagged, scored 0."""
    return Verdict({name: 0.0 for name in categories}, dict.fromkeys(categories, False), False)


def combine(judgements: list[Judgement], categories: tuple[str, ...]) -> Judgement:
    """The output's judgement from its windows': a flagged window flags it (each category's
    score the highest any window gave); otherwise a window that could not be judged leaves
    the output unjudged (its first failure); otherwise the windows' verdicts merged."""
    verdicts = [j for j in judgements if isinstance(j, Verdict)]
    failures = [j for j in judgements if isinstance(j, Failure)]
    if failures and not any(v.flagged for v in verdicts):
        return failures[0]
    merged = clean(categories)
    scores, flags = dict(merged.scores), dict(merged.categories)
    for verdict in verdicts:
        for name, score in verdict.scores.items():
            scores[name] = max(scores.get(name, 0.0), score)
        for name, flag in verdict.categories.items():
            flags[name] = flags.get(name, False) or flag
    return Verdict(scores, flags, any(v.flagged for v in verdicts))


# --- the policy ------------------------------------------------------------------------------

# A category the policy declares: a bullet that starts with its name in backticks.
_CATEGORY_LINE = re.compile(r"^\s*[-*]\s+`([^`\s]+)`", re.MULTILINE)


def load_policy(path: str | None) -> str:
    """The operator's policy text (a file), or the shipped default."""
    if path is not None:
        return Path(path).expanduser().read_text(encoding="utf-8")
    return resources.files(__package__).joinpath(DEFAULT_POLICY).read_text(encoding="utf-8")


def policy_categories(policy: str) -> tuple[str, ...]:
    """The categories ``policy`` declares (bullets starting with a backticked name), in order;
    none: the results name the categories the classifier reports."""
    return tuple(dict.fromkeys(_CATEGORY_LINE.findall(policy)))


# --- reading the classifier's answer ---------------------------------------------------------

# Confidence words the guide's rationale format uses, as scores.
_WORD_SCORES = {"high": 0.9, "medium": 0.6, "low": 0.3, "none": 0.0}


def parse_answer(answer: str | None, categories: tuple[str, ...], threshold: float) -> Judgement:
    """The classifier's final answer as a verdict under the policy's ``categories`` (empty:
    whatever it names), a category flagged at ``threshold`` or above. Read leniently (the
    JSON object anywhere in the text, in a code fence or after prose; scores as numbers,
    booleans or confidence words; the guide's ``policy_category`` and a bare ``0``/``1``),
    but a `Failure` for anything else: never an exception."""
    if answer is None or not answer.strip():
        return Failure(UNPARSEABLE, "The moderation model gave no answer.")
    text = answer.strip()
    if text in ("0", "1"):  # the guide's binary format
        verdict = clean(categories)
        return Verdict(verdict.scores, verdict.categories, text == "1")
    found = _json_object(text)
    if found is None:
        return Failure(UNPARSEABLE, "The moderation model's answer holds no JSON object.")
    scores = _scores(found)
    if scores is None:
        return Failure(UNPARSEABLE, "The moderation model's answer has no readable categories.")
    known = categories or tuple(scores)
    unknown = set(scores) - set(known)
    if unknown:
        logger.info("moderation: categories outside the policy ignored: %s", sorted(unknown))
    scored = {name: scores.get(name, 0.0) for name in known}
    flags = {name: score >= threshold for name, score in scored.items()}
    violation = _flag(found.get("violation"))
    # The classifier's own verdict counts too: a violation it names no category for is still
    # a violation (under `block`, missing it would let flagged content through).
    return Verdict(scored, flags, any(flags.values()) or violation)


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that parses."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _scores(answer: dict[str, Any]) -> dict[str, float] | None:
    """Each category's score in ``answer``: ``categories`` as a mapping (name to a score) or a
    list (the flagged names), and the guide's ``policy_category``. None: nothing readable."""
    raw = answer.get("categories", answer.get("category_scores"))
    scores: dict[str, float] = {}
    if isinstance(raw, dict):
        for name, value in raw.items():
            score = _score(value)
            if score is None:
                return None
            scores[str(name)] = score
    elif isinstance(raw, list):
        scores = {str(name): 1.0 for name in raw if isinstance(name, str)}
    elif raw is not None:
        return None
    named = answer.get("policy_category")
    if isinstance(named, str) and named and _flag(answer.get("violation")):
        scores[named] = max(scores.get(named, 0.0), 1.0)
    if raw is None and "violation" not in answer and not scores:
        return None
    return scores


def _score(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value):
        return min(1.0, max(0.0, float(value)))
    if isinstance(value, str) and value.strip().lower() in _WORD_SCORES:
        return _WORD_SCORES[value.strip().lower()]
    if isinstance(value, dict):  # {"score": 0.8, ...}
        return _score(value.get("score", value.get("confidence")))
    return None


def _flag(value: Any) -> bool:
    return value is True or (isinstance(value, int | float) and value >= 1)


# --- the Response's results ------------------------------------------------------------------


def _result(judgement: Judgement, model: str) -> dict[str, Any]:
    if isinstance(judgement, Failure):
        return {"type": "error", "code": judgement.code, "message": judgement.message}
    return {
        "type": "moderation_result",
        "model": model,
        "flagged": judgement.flagged,
        "categories": judgement.categories,
        "category_scores": judgement.scores,
        # The classifier reads text only.
        "category_applied_input_types": {name: ["text"] for name in judgement.categories},
    }


@dataclass(frozen=True)
class ModerationResults:
    """Both sides' judgements, as ``Response.moderation`` carries them."""

    model: str
    input: Judgement
    output: Judgement

    def response_field(self) -> Moderation:
        return Moderation.model_validate(
            {"input": _result(self.input, self.model), "output": _result(self.output, self.model)}
        )
