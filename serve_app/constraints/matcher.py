"""Compile a constraint once per distinct grammar; hand each request its own matcher."""

from __future__ import annotations

import functools

import llguidance

from serve_app.constraints.grammar import to_lark
from serve_app.constraints.spec import CompletionConstraint
from serve_app.constraints.vocab import harmony_tokenizer

# Distinct grammars kept compiled: one per (schema, tools, tool_choice) a client sends.
CACHE_SIZE = 256


class ConstraintError(ValueError):
    """The constraint cannot be compiled (a schema or grammar llguidance rejects)."""


@functools.lru_cache(maxsize=CACHE_SIZE)
def _compiled(grammar: str) -> llguidance.LLMatcher:
    tokenizer = harmony_tokenizer()
    error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        raise ConstraintError(error)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise ConstraintError(matcher.get_error())
    return matcher


def compile_grammar(grammar: str) -> llguidance.LLMatcher:
    """A fresh matcher for ``grammar`` at its start (a copy of the cached compiled one)."""
    return _compiled(grammar).deep_copy()


def new_matcher(
    constraint: CompletionConstraint,
    *,
    compact_json: bool = True,
    max_free_tokens: int | None = None,
) -> llguidance.LLMatcher:
    """A fresh matcher for one completion under ``constraint`` (``compact_json`` false: to
    check JSON written with whitespace, e.g. a test script's ``json.dumps``;
    ``max_free_tokens``: as ``to_lark``'s)."""
    grammar = to_lark(constraint, compact_json=compact_json, max_free_tokens=max_free_tokens)
    return compile_grammar(grammar)


def cache_info() -> functools._CacheInfo:
    return _compiled.cache_info()
