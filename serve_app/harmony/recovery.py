"""Reading malformed harmony: what the stream translator recovers from, and how.

The stream translator (``stream.py``) decodes each message with a harmony ``StreamableParser``
(``strict=True``), one message at a time, and owns recovery, because models emit malformed
harmony and the parser raises on it. The parser's ``strict=False`` mode only changes one case
(a stop token inside a header): it then joins the header words with single spaces and drops the
recipient. Our own salvage of such headers keeps the text as written and still recovers tool
calls, so we parse strictly and handle these cases:

- text with no header (``Hello`` right after ``<|start|>assistant``): a final message;
- a header cut short by a stop token, by ``<|start|>``, or by the end of generation;
- a header the parser rejects (duplicated ``to=``, empty channel, undecodable tokens): the
  channel and first recipient are read leniently and the content goes on streaming;
- tokens after ``<|call|>``/``<|end|>`` without ``<|start|>assistant`` (how parallel tool
  calls often arrive): read as if ``<|start|>assistant`` were there;
- ``<|start|>`` or ``<|channel|>`` inside content: the model skipped ``<|end|>``, so the
  message ends there and a new one begins;
- token ids outside the vocabulary: dropped (harmony would otherwise hold them back as an
  incomplete UTF-8 sequence and swallow the rest of the message).

A parser is made per message (never shared across responses) so a failure cannot leak into
the next message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Read a header the parser rejected: `<|channel|>NAME`, `to=RECIPIENT`, `<|constrain|>TYPE`
# in any order, each optionally preceded by whitespace. What follows is content.
_HEADER_FIELD = re.compile(
    r"\s*(?:<\|channel\|>(?P<channel>[^\s<]*)|to=(?P<to>[^\s<]+)|<\|constrain\|>[\w.\-]*)"
)
# After `<|start|>` the header begins with the author's role.
_ROLE_WORD = re.compile(r"\s*(?:assistant|user|system|developer)\b")
_RECIPIENT_TAIL = re.compile(r"[\s<]")
# Recipients that name a conversation role, not a tool (a hallucinated tool result is
# addressed `to=assistant`).
ROLE_RECIPIENTS = {"assistant", "user", "system", "developer"}


@dataclass(frozen=True)
class LooseHeader:
    channel: str | None
    recipient: str | None
    # Text after the header fields (content, when the header never reached `<|message|>`).
    rest: str
    # Whether any header field was recognised (else the "header" was plain text).
    had_fields: bool


def parse_loose_header(text: str, *, leading_role: bool) -> LooseHeader:
    pos = 0
    if leading_role and (role := _ROLE_WORD.match(text)):
        pos = role.end()
    channel: str | None = None
    recipient: str | None = None
    had_fields = False
    while (field := _HEADER_FIELD.match(text, pos)) and field.end() > pos:
        pos = field.end()
        had_fields = True
        # The first value wins: a duplicated `to=` is usually the model repeating itself.
        if field["channel"] and channel is None:
            channel = field["channel"]
        if field["to"] and recipient is None:
            recipient = field["to"]
    rest = text[pos:]
    return LooseHeader(channel, recipient, rest.lstrip() if had_fields else rest, had_fields)


def header_is_text(text: str) -> bool | None:
    """Whether a header read so far, decoded and holding no special token, is ordinary text
    the model wrote without a header; None while too early to tell. Without a special token a
    header can only be a recipient (`` to=functions.x``)."""
    text = text.lstrip()
    if not text or "to=".startswith(text):
        return None
    return not text.startswith("to=")


def recipient_name(recipient: str) -> str:
    """`ns.foo<|constrain|>json` / `ns.foo code` -> `ns.foo`: the name a recipient no tool
    matches is answered by (the model's own spelling, less what follows it in the header)."""
    return _RECIPIENT_TAIL.split(recipient.strip(), maxsplit=1)[0] or recipient.strip()
