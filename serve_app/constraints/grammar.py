"""A `CompletionConstraint` as an llguidance Lark grammar over harmony's tokens.

The completion starts right after the prompt's ``<|start|>assistant``, so its first message
has no ``<|start|>assistant`` and every later one has::

    start: (free <|start|> "assistant")* answer

``<|channel|>``, ``<|message|>``... are harmony's special tokens (one token each, never text);
free text (``TEXT``) cannot contain them, so a free message runs until its ``<|end|>``. The
same text is what vLLM's ``guidance`` backend takes as ``structured_outputs.grammar``.
"""

from __future__ import annotations

import json
from typing import Any

from serve_app.constraints import ijson
from serve_app.constraints.spec import Body, CompletionConstraint, ToolCallRule

# JSON bodies are compact (no free whitespace): gpt-oss writes tool arguments that way, and a
# grammar that allows unbounded whitespace lets a weak sampler pad forever.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# For checking JSON someone else wrote (a test script's): any whitespace between tokens.
_FLEXIBLE_JSON_OPTIONS = {"whitespace_flexible": True}
_CONSTRAIN_JSON = '" " <|constrain|> "json"'


def to_lark(
    constraint: CompletionConstraint,
    *,
    compact_json: bool = True,
    max_free_tokens: int | None = None,
) -> str:
    """The grammar for ``constraint`` (deterministic: equal constraints, equal text).
    ``compact_json`` false: JSON bodies may have whitespace (to check, not to sample).
    ``max_free_tokens``: each free message (analysis, preamble) ends after at most that many
    tokens; None leaves them unbounded (the model decides when it has reasoned enough)."""
    options = _JSON_OPTIONS if compact_json else _FLEXIBLE_JSON_OPTIONS
    rules = [
        "%llguidance {}",
        'start: (free <|start|> "assistant")* answer',
        "free: " + " | ".join(_free_messages(constraint)),
        _free_text_rule(max_free_tokens),
    ]
    answers: list[str] = []
    if constraint.final is not None:
        answers.append("final")
        rules += _final_rules(constraint.final, options)
    for index, call in enumerate(constraint.tool_calls):
        answers.append(f"call_{index}")
        rules += _call_rules(call, index, options)
    rules.append("answer: " + " | ".join(answers))
    rules.append("TEXT: /(?s:.*)/")
    return "\n".join(rules) + "\n"


def _free_messages(constraint: CompletionConstraint) -> list[str]:
    # Only a bare channel name before <|message|>: a recipient (`to=...`) there would be a tool
    # call outside the calls the constraint allows, so none is written on analysis.
    channels = ["analysis", "commentary"] if constraint.preambles else ["analysis"]
    return [f'<|channel|> "{channel}" <|message|> free_text <|end|>' for channel in channels]


def _free_text_rule(max_tokens: int | None) -> str:
    # llguidance's max_tokens ends the lexeme after that many tokens: <|end|> must come next.
    return "free_text: TEXT" if max_tokens is None else f"free_text[max_tokens={max_tokens}]: TEXT"


def _final_rules(body: Body, options: dict[str, Any]) -> list[str]:
    # No ``<|constrain|>json`` in a final header: harmony's parser reads it as a recipient
    # there, and the stream translator would then report a function call.
    return [
        'final: <|channel|> "final" <|message|> final_body <|return|>',
        f"final_body: {_body(body, options)}",
    ]


def _call_rules(call: ToolCallRule, index: int, options: dict[str, Any]) -> list[str]:
    """Both header orders harmony allows: the recipient after the channel (what gpt-oss
    usually writes) or before it."""
    to = json.dumps(f" to={call.recipient}")
    constrain = _header_constrain(call)
    return [
        f'call_{index}: <|channel|> "commentary" {to} {constrain} <|message|> body_{index} <|call|>'
        f'\n    | {to} <|channel|> "commentary" {constrain} <|message|> body_{index} <|call|>',
        f"body_{index}: {_body(call.body, options)}",
    ]


def _header_constrain(call: ToolCallRule) -> str:
    if call.kind == "custom":
        return ""
    # A strict function call is JSON and says so; a free one may or may not.
    return _CONSTRAIN_JSON if call.body.kind == "json" else f"({_CONSTRAIN_JSON})?"


def _body(body: Body, options: dict[str, Any]) -> str:
    if body.kind == "json":
        # Numbers a client's JSON.parse reads back as they were written (constraints/ijson.py).
        schema = ijson.bounded(json.loads(body.source))
        if isinstance(schema, dict):
            schema = {**schema, "x-guidance": options}
        return "%json " + json.dumps(schema)
    if body.kind == "lark":
        return "%lark {\n" + body.source + "\n}"
    if body.kind == "regex":
        return "/" + _lark_regex(body.source) + "/"
    return "TEXT"


def _lark_regex(pattern: str) -> str:
    """``pattern`` inside Lark's ``/.../``: an unescaped ``/`` would end it early."""
    out: list[str] = []
    escaped = False
    for char in pattern:
        if char == "/" and not escaped:
            out.append("\\/")
        else:
            out.append(char)
        escaped = char == "\\" and not escaped
    return "".join(out)
