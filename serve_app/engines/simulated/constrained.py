"""Constraint sampling and checking: an unscripted completion that must be JSON or must call
a tool is sampled under the llguidance grammar's token mask; a scripted turn is checked against
the constraint (a turn that breaks it is the test script's fault, said as an `EngineError`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from serve_app.constraints.matcher import ConstraintError, new_matcher
from serve_app.constraints.spec import CompletionConstraint
from serve_app.constraints.vocab import harmony_tokenizer
from serve_app.engines.base import EngineError
from serve_app.engines.simulated.steps import Emit, Fail, Step
from serve_app.engines.simulated.tokens import harmony_tokens
from serve_app.harmony.encoding import CALL_TOKEN, RETURN_TOKEN

_VOCABULARY_LOADED = False


async def vocabulary_loaded() -> None:
    """The llguidance vocabulary, built once (about a second) off the event loop, on the first
    constrained request: unconstrained requests and engine start-up never pay for it. Grammar
    compiles (milliseconds, cached) and per-token masks (about 0.2 ms) run inline."""
    global _VOCABULARY_LOADED
    if not _VOCABULARY_LOADED:
        await asyncio.to_thread(harmony_tokenizer)
        _VOCABULARY_LOADED = True


def to_sample(constraint: CompletionConstraint | None) -> CompletionConstraint | None:
    """What an unscripted completion is sampled under, or None for the default answer.

    The default answer (analysis, then a free final message) obeys any constraint that allows
    a free final answer. Where the final answer must be JSON but a tool call is not required,
    the sampler answers and calls no tool: this engine never calls a tool on its own.
    """
    if constraint is None:
        return None
    if constraint.final is None:
        return constraint  # a call is required (tool_choice required or named)
    if constraint.final.free:
        return None
    return replace(constraint, tool_calls=())


def compile_matcher(constraint: CompletionConstraint, *, compact_json: bool = True) -> Any:
    try:
        return new_matcher(constraint, compact_json=compact_json)
    except ConstraintError as exc:
        # A schema or grammar llguidance rejects: the request's fault.
        message = f"the request's constraint cannot be compiled: {exc}"
        raise EngineError(message, "invalid_request") from exc


def turn_violation(plan: Sequence[Step], constraint: CompletionConstraint) -> str | None:
    """Why a scripted turn breaks ``constraint``, or None if it obeys it.

    A turn may play several messages ending in ``<|call|>`` (calls a real model would make in
    successive completions): each stop token ends one completion, checked from the grammar's
    start; the ``<|start|>assistant`` that opens the next one belongs to no completion. The last
    completion must end too, unless the turn fails on purpose.
    """
    encoder = harmony_tokens()
    tokens = [token for step in plan if isinstance(step, Emit) for token in step.tokens]
    completions: list[list[int]] = [[]]
    for token in tokens:
        completions[-1].append(token)
        if token in (RETURN_TOKEN, CALL_TOKEN):
            completions.append([])
    if not completions[-1]:
        completions.pop()
    for number, completion in enumerate(completions):
        if number and tuple(completion[: len(encoder.start_assistant)]) == encoder.start_assistant:
            completion = completion[len(encoder.start_assistant) :]
        # A script's JSON is json.dumps'd (spaces after , and :): valid JSON all the same.
        matcher = compile_matcher(constraint, compact_json=False)
        accepted = matcher.validate_tokens(completion)
        # validate_tokens does not count the grammar's last token (its stop token).
        if accepted < len(completion) - 1 or not matcher.consume_tokens(completion):
            seen = encoder.encoding.decode(completion[: accepted + 1])
            return f"not allowed at the end of {seen!r}"
    ends = bool(completions) and completions[-1][-1:] in ([RETURN_TOKEN], [CALL_TOKEN])
    if not ends and not any(isinstance(step, Fail) for step in plan):
        return "it ends before the answer or tool call the constraint requires"
    return None
