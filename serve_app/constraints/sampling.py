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

from serve_app.constraints.vocab import MODEL_VOCAB_SIZE
from serve_app.harmony.encoding import FIRST_SPECIAL_TOKEN, get_encoding

# Short tokens that end or advance JSON and line-based grammars.
_STRUCTURAL_TEXT = (
    *('"', "}", "]", ",", "{", "[", ":", '":', '",', '"}', '"]', '":"', '","'),
    *("true", "false", "null", "0", "1", "7", "42", "-", ".", "e", "a", "b"),
    *("\n", "***", " End", " Patch", "+", "@@", " "),
)
_P_SPECIAL = 0.08
_P_STRUCTURAL = 0.5
# Random draws tried before scanning the whole mask for an allowed plain token.
_REJECTION_TRIES = 8
_SPECIAL_IDS = np.arange(FIRST_SPECIAL_TOKEN, MODEL_VOCAB_SIZE)
# Plain ids that share their bitmask byte with the first special ids.
_WHOLE_PLAIN_BYTES = FIRST_SPECIAL_TOKEN >> 3
_PLAIN_TAIL_IDS = np.arange(_WHOLE_PLAIN_BYTES << 3, FIRST_SPECIAL_TOKEN)


@functools.cache
def _structural_ids() -> np.ndarray:
    encoding = get_encoding()
    ids = {tuple(encoding.encode(text, allowed_special=set())) for text in _STRUCTURAL_TEXT}
    return np.array(sorted(token[0] for token in ids if len(token) == 1), dtype=np.int64)


class TokenMask:
    """The tokens a matcher allows next, read from llguidance's packed bitmask (one bit per
    token id, little-endian) without unpacking its 200k bits: a step reads a few bytes."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._packed = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)

    def allows(self, tokens: np.ndarray) -> np.ndarray:
        return ((self._packed[tokens >> 3] >> (tokens & 7)) & 1).astype(bool)

    def specials(self) -> np.ndarray:
        """The allowed special tokens (harmony's, from ``FIRST_SPECIAL_TOKEN``), ascending."""
        return _SPECIAL_IDS[self.allows(_SPECIAL_IDS)]

    def has_plain(self) -> bool:
        return bool(self._packed[:_WHOLE_PLAIN_BYTES].any() or self.allows(_PLAIN_TAIL_IDS).any())

    def plain(self) -> np.ndarray:
        """Every allowed plain token id, ascending. Only the bytes with a bit set are
        unpacked: a sparse mask (a digit, a key) has a few dozen of its 25k bytes set."""
        set_bytes = np.flatnonzero(self._packed[:_WHOLE_PLAIN_BYTES])
        bits = np.unpackbits(self._packed[set_bytes, None], axis=1, bitorder="little")
        rows, columns = np.nonzero(bits)
        tail = _PLAIN_TAIL_IDS[self.allows(_PLAIN_TAIL_IDS)]
        return np.concatenate(((set_bytes[rows] << 3) + columns, tail))


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
        token = self._choose(TokenMask(self._matcher))
        if not self._matcher.consume_token(token):
            raise DeadEnd(f"the matcher refused its own token: {self._matcher.get_error()}")
        return token

    def sample(self, max_tokens: int) -> list[int]:
        tokens: list[int] = []
        while not self.done and len(tokens) < max_tokens:
            tokens.append(self.next_token())
        return tokens

    def _choose(self, mask: TokenMask) -> int:
        specials = mask.specials()
        has_plain = mask.has_plain()
        coin = self._rng.random()
        if len(specials) and (coin < _P_SPECIAL or not has_plain):
            return self._pick(specials)
        if not has_plain:
            raise DeadEnd(f"no token allowed: {self._matcher.get_error()}")
        if coin < _P_STRUCTURAL:
            structural = _structural_ids()[mask.allows(_structural_ids())]
            if len(structural):
                return self._pick(structural)
        return self._uniform_plain(mask)

    def _uniform_plain(self, mask: TokenMask) -> int:
        """A plain token uniformly among the allowed ones. Where most are allowed (free text),
        a few random draws find one (rejection sampling, the same distribution); the scan of
        all 200k ids is left for sparse masks."""
        for _ in range(_REJECTION_TRIES):
            token = self._rng.randrange(FIRST_SPECIAL_TOKEN)
            if mask.allows(np.array([token]))[0]:
                return token
        return self._pick(mask.plain())

    def _pick(self, candidates: np.ndarray) -> int:
        return int(candidates[self._rng.randrange(len(candidates))])
