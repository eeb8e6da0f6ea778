"""A server-run tool's answer as harmony tokens, within bounds: what the tool loop gives the
model of a result (serving/tools/bounds.py), checked before it is tokenized whole (a piece past
the tokenizer's limit, a prefix already over the bound). Module-level functions: a render
worker imports them (serving/turn/render_pool.py) and runs them for large text."""

from __future__ import annotations

from openai_harmony import Author, Message, Role

from serve_app.harmony.encoding import get_encoding
from serve_app.harmony.pieces import long_piece


class LongPiece(ValueError):
    """Text holding a tokenizer piece longer than `MAX_PIECE_CHARS` (harmony/pieces.py): not
    tokenized, as tokenizing it would take time quadratic in its length."""

    def __init__(self, length: int) -> None:
        super().__init__(length)  # its args: how it pickles back from a render worker
        self.length = length


class TooManyTokens(ValueError):
    """A tool's message holds more than a bound's tokens: ``tokens`` of a prefix of it did."""

    def __init__(self, tokens: int) -> None:
        super().__init__(tokens)  # its args: how it pickles back from a render worker
        self.tokens = tokens


# Characters per token a prefix is cut at to find a message over a bound without tokenizing
# all of it (o200k averages ~4 for English prose, fewer for code and numbers): a 900 KB
# output over a 16k-token bound costs ~100 KB of tokenizing.
PROBE_CHARS_PER_TOKEN = 6


def tool_message_tokens(
    recipient: str, channel: str, text: str, limit: int | None = None
) -> list[int]:
    """A server-run tool's answer as the model's next prompt holds it (the tool loop,
    serving/tools/loop.py): author the recipient (``testtools.echo``, ``browser.search``), on
    the channel of its call, to the assistant. Raises `LongPiece` before tokenizing text that
    holds a piece past the limit a request's input is held to, and `TooManyTokens` when a
    prefix of the message alone holds more than ``limit`` tokens (having tokenized no more).
    Module-level: a render worker imports it (both checks run there for large text)."""
    length = long_piece(text)
    if length:
        raise LongPiece(length)
    if limit is not None:
        cut = _piece_boundary(text, limit * PROBE_CHARS_PER_TOKEN)
        if cut:
            probed = len(_tool_message(recipient, channel, text[:cut]))
            if probed > limit:
                raise TooManyTokens(probed)
    return _tool_message(recipient, channel, text)


def _tool_message(recipient: str, channel: str, text: str) -> list[int]:
    message = (
        Message.from_author_and_content(Author.new(Role.TOOL, recipient), text)
        .with_channel(channel)
        .with_recipient("assistant")
    )
    return list(get_encoding().render(message))


def _piece_boundary(text: str, at: int) -> int:
    """A cut at or before ``at`` where the text's tokens of what comes before are the
    prefix's own: a space after a non-space character (o200k's pieces never span one: a
    word, a number or punctuation ends there, and whitespace pieces start there). 0: none,
    or the text is no longer than ``at``."""
    if len(text) <= at:
        return 0
    cut = text.rfind(" ", 0, at)
    while cut > 0 and text[cut - 1].isspace():
        cut = text.rfind(" ", 0, cut)
    return max(cut, 0)
