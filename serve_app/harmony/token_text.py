"""Token ids as the stream translator reads them: harmony's structural tokens, which ids are
valid, and each token's text and exact bytes.

Logprobs (when the engine's chunks carry them, i.e. the request included
``message.output_text.logprobs``): only the content tokens of ``message`` items (the
``output_text``) get entries; header, stop and reasoning or tool-call tokens get none. A token's
entry is held until a delta first carries its text (a token that ends inside a UTF-8
character waits for the next one) and given to the writer with that delta. Token text and
bytes are decoded per token with harmony's encoding, bytes exactly: a token that splits a
character keeps its bytes, and its ``token`` shows U+FFFD.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from openai.types.responses.response_output_text import Logprob as TextLogprob
from openai.types.responses.response_output_text import LogprobTopLogprob as TextTopLogprob

from serve_app.harmony.encoding import (
    CALL_TOKEN,
    CHANNEL_TOKEN,
    END_TOKEN,
    FIRST_SPECIAL_TOKEN,
    MESSAGE_TOKEN,
    RETURN_TOKEN,
    START_TOKEN,
    get_encoding,
)
from serve_app.values import TokenLogprob


@dataclass(frozen=True)
class StructuralTokens:
    start: int
    channel: int
    message: int
    stops: frozenset[int]
    # `<|channel|>final<|message|>`: puts a fresh parser into content state.
    content_header: tuple[int, ...]


@functools.cache
def structural_tokens() -> StructuralTokens:
    header = get_encoding().encode("<|channel|>final<|message|>", allowed_special="all")
    return StructuralTokens(
        start=START_TOKEN,
        channel=CHANNEL_TOKEN,
        message=MESSAGE_TOKEN,
        stops=frozenset((END_TOKEN, RETURN_TOKEN, CALL_TOKEN)),
        content_header=tuple(header),
    )


@functools.lru_cache(maxsize=4096)
def _decodable(token: int) -> bool:
    try:
        get_encoding().decode([token])
    except Exception:
        return False
    return True


@functools.lru_cache(maxsize=65536)
def token_text(token: int) -> tuple[str, tuple[int, ...]]:
    """A token's text and exact bytes (a piece of a UTF-8 character shows as U+FFFD)."""
    try:
        # surrogateescape round-trips undecodable bytes: harmony's public decode, exact bytes.
        data = (
            get_encoding()
            .decode([token], errors="surrogateescape")
            .encode("utf-8", errors="surrogateescape")
        )
    except Exception:
        return "", ()
    return data.decode("utf-8", errors="replace"), tuple(data)


def text_logprob(token: int, entry: TokenLogprob) -> TextLogprob:
    logprob, alternatives = entry
    text, data = token_text(token)
    top = []
    for alternative, value in alternatives:
        alt_text, alt_data = token_text(alternative)
        top.append(TextTopLogprob(token=alt_text, bytes=list(alt_data), logprob=value))
    return TextLogprob(token=text, bytes=list(data), logprob=logprob, top_logprobs=top)


def valid_token(token: int) -> bool:
    return 0 <= token < FIRST_SPECIAL_TOKEN or (token >= 0 and _decodable(token))
