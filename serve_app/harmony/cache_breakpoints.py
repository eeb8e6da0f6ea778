"""Where the ``prompt_cache_breakpoint`` marks of a request land in its rendered prompt.

A breakpoint marks the end of a content part the client wrote; the engine sees token ids, so
each is turned into the token index where that part ends (exclusive: the prefix
``token_ids[:index]`` holds the part). Found after rendering, in the rendered token ids, so it
holds whatever rendering did (instructions merged into the developer message, truncation,
the render pool): a marked message's text is looked for from the prompt's end backwards, and
within it the part ends after the last token wholly within the text up to it. A message no
longer in the prompt (truncated away) marks nothing.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from serve_app.harmony.encoding import get_encoding
from serve_app.protocol.requests import InputItem, MessageItem

_ITEMSIZE = array("I").itemsize


def breakpoint_positions(token_ids: Sequence[int], items: Sequence[InputItem]) -> list[int]:
    """The prompt positions of the marked parts of ``items`` (the rendered history and input),
    ascending, each the token index where its part ends."""
    marked = [(item, prefixes) for item in items if (prefixes := _marked_prefixes(item))]
    if not marked:  # the common case: no copy of the prompt
        return []
    haystack = array("I", token_ids).tobytes()
    end = len(haystack)  # each earlier message is looked for before the later one found
    positions: list[int] = []
    for item, prefixes in reversed(marked):
        content = _encode(item.text)
        start = _rfind(haystack, content, end)
        if start is None:
            continue
        end = start * _ITEMSIZE
        for prefix in reversed(prefixes):
            positions.append(start + _tokens_within(content, len(prefix)))
    return sorted(set(positions))


def _marked_prefixes(item: InputItem) -> list[str]:
    """For a message whose parts carry breakpoints: its text up to and including each."""
    if not isinstance(item, MessageItem) or isinstance(item.content, str):
        return []
    prefixes, text = [], ""
    for part in item.content:
        text += part.as_text()
        if part.prompt_cache_breakpoint is not None:
            prefixes.append(text)
    return prefixes


def _tokens_within(content: list[int], chars: int) -> int:
    """How many of a message's tokens lie wholly within its first ``chars`` characters: a
    token that spans the end of a part belongs to the text after it too (``" Question"``
    after a part ending in a space), so the prefix stops before it."""
    low, high = 0, len(content)
    while low < high:
        middle = (low + high + 1) // 2
        if len(get_encoding().decode(content[:middle])) <= chars:
            low = middle
        else:
            high = middle - 1
    return low


def _encode(text: str) -> list[int]:
    return get_encoding().encode(text, allowed_special=set())


def _rfind(haystack: bytes, needle: list[int], end: int) -> int | None:
    """The token index of the last whole-token occurrence of ``needle`` before byte ``end``."""
    if not needle:
        return None
    pattern = array("I", needle).tobytes()
    at = haystack.rfind(pattern, 0, end)
    while at >= 0 and at % _ITEMSIZE:  # a match must start on a token boundary
        at = haystack.rfind(pattern, 0, at + len(pattern) - 1)
    return None if at < 0 else at // _ITEMSIZE
