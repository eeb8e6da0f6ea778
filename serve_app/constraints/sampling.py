"""Seeded sampling under a grammar's token mask: output valid by construction.

There is no model here, only a preference that makes random output end: a sampler uniform
over the allowed tokens would almost never pick ``<|end|>`` among 200k tokens, nor ``"`` inside
a JSON string. So each step picks, by a seeded coin: a special token (ends free text), a short
structural token (closes strings, objects, lines), or any allowed token.
"""

from __future__ import annotations

import functools
import random

import llguidance
import numpy as np

from serve_app.constraints.vocab import FIRST_SPECIAL, harmony_tokenizer
from serve_app.harmony.encoding import get_encoding

# Short tokens that end or advance JSON and line-based grammars.
_STRUCTURAL_TEXT = (
    *('"', "}", "]", ",", "{", "[", ":", '":', '",', '"}', '"]', '":"', '","'),
    *("true", "false", "null", "0", "1", "7", "42", "-", ".", "e", "a", "b"),
    *("\n", "***", " End", " Patch", "+", "@@", " "),
)
_P_SPECIAL = 0.08
_P_STRUCTURAL = 0.5


@functools.cache
def _structural_ids() -> np.ndarray:
    encoding = get_encoding()
    ids = {tuple(encoding.encode(text, allowed_special=set())) for text in _STRUCTURAL_TEXT}
    return np.array(sorted(token[0] for token in ids if len(token) == 1), dtype=np.int64)


def allowed_bits(matcher: llguidance.LLMatcher) -> np.ndarray:
    """One 0/1 entry per token id: whether ``matcher`` allows it next."""
    mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.unpackbits(mask, bitorder="little")[: harmony_tokenizer().vocab_size]


def allowed_tokens(matcher: llguidance.LLMatcher) -> np.ndarray:
    """The token ids ``matcher`` allows next, ascending."""
    return np.flatnonzero(allowed_bits(matcher))


class DeadEnd(RuntimeError):
    """The grammar allows no token here, or refused the one it allowed: a bug in a grammar or
    in llguidance, never the client's request (its schemas and grammars compiled)."""


class MaskedSampler:
    """Draws one completion's tokens under ``matcher``; the same seed, the same tokens."""

    def __init__(self, matcher: llguidance.LLMatcher, seed: int) -> None:
        self._matcher = matcher
        self._rng = random.Random(seed)

    @property
    def done(self) -> bool:
        """The grammar has ended (its last token, ``<|return|>`` or ``<|call|>``, is out)."""
        return self._matcher.is_stopped()

    def next_token(self) -> int:
        token = self._choose(allowed_bits(self._matcher))
        if not self._matcher.consume_token(token):
            raise DeadEnd(f"the matcher refused its own token: {self._matcher.get_error()}")
        return token

    def sample(self, max_tokens: int) -> list[int]:
        tokens: list[int] = []
        while not self.done and len(tokens) < max_tokens:
            tokens.append(self.next_token())
        return tokens

    def _choose(self, bits: np.ndarray) -> int:
        # A full scan of the 200k plain ids is the cost: only the uniform branch pays it.
        specials = FIRST_SPECIAL + np.flatnonzero(bits[FIRST_SPECIAL:])
        has_plain = bool(bits[:FIRST_SPECIAL].any())
        coin = self._rng.random()
        if len(specials) and (coin < _P_SPECIAL or not has_plain):
            return self._pick(specials)
        if not has_plain:
            raise DeadEnd(f"no token allowed: {self._matcher.get_error()}")
        if coin < _P_STRUCTURAL:
            structural = _structural_ids()[bits[_structural_ids()] == 1]
            if len(structural):
                return self._pick(structural)
        return self._pick(np.flatnonzero(bits[:FIRST_SPECIAL]))

    def _pick(self, candidates: np.ndarray) -> int:
        return int(candidates[self._rng.randrange(len(candidates))])
