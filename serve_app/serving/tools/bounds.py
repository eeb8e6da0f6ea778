"""What the model is given of a server-run tool's result: a bound in tokens that fits the
context, checked without holding the ingress's event loop.

A result (its output, or its error: the model reads both) passes when its text holds no
tokenizer piece longer than a request's input may (`long_piece`, harmony/pieces.py: byte-pair
merging is quadratic in a piece's length, so a 700 KB run of one letter took minutes of CPU;
checked before anything tokenizes it, in `tool_message_tokens`) and its harmony message is at
most the call's budget in tokens: ``tools.max_output_tokens``, never more than the context
leaves less ``tools.output_reserve_tokens`` (the model's room to answer), shared by the
round's calls. Past either, the call fails with a short error, which is what the model reads
instead.

The message is rendered once, here: its token count is the check, and its tokens are what
the continuation's prompt appends (loop.py). Text longer than ``limits.render_inline_chars``
is checked and rendered in the render pool's workers (serving/turn/render_pool.py), as a
large request is: two 900 KB outputs held the event loop 1.1 s when they rendered on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from serve_app.config import AppArgs
from serve_app.harmony.pieces import MAX_PIECE_CHARS
from serve_app.harmony.tool_messages import LongPiece, TooManyTokens, tool_message_tokens
from serve_app.protocol.errors import APIError
from serve_app.protocol.tool_items import ToolResult

logger = logging.getLogger(__name__)

# Characters of a data value a failed result keeps for its item (a URL, an id): a bounded
# result drops the rest, which may be the very output it refused (a python call's logs).
_KEPT_DATA_CHARS = 2048


class OffLoop(Protocol):
    """Renders token ids away from the event loop when the text is large (`RenderPool`)."""

    async def tokens_of(
        self, render: Callable[..., list[int]], args: tuple[Any, ...], size: int, owner: str | None
    ) -> list[int]: ...


class _Inline:
    """No pool (a test's loop): render where asked."""

    async def tokens_of(
        self, render: Callable[..., list[int]], args: tuple[Any, ...], size: int, owner: str | None
    ) -> list[int]:
        return render(*args)


@dataclass(frozen=True)
class Budget:
    """The most tokens one call's message may take, and which bound set it."""

    tokens: int
    by_context: bool = False

    def reason(self, tokens: int, *, at_least: bool = False) -> str:
        room = "the context has left for it" if self.by_context else "tools.max_output_tokens"
        size = f"at least {tokens:,}" if at_least else f"{tokens:,}"
        return (
            f"The tool's output is {size} tokens, more than the {self.tokens:,} "
            f"this response takes ({room}): it was not passed on. Ask for less (a narrower "
            "query, fewer lines, a smaller page)."
        )


@dataclass(frozen=True)
class Bounded:
    """A result as the model is given it, and its harmony message's token ids."""

    result: ToolResult
    tokens: list[int] = field(default_factory=list)


class OutputBounds:
    """The bounds of ``args`` (``tools.max_output_tokens``, ``tools.output_reserve_tokens``,
    ``max_context_tokens``), rendering large messages with ``off_loop``."""

    def __init__(self, args: AppArgs, off_loop: OffLoop | None = None) -> None:
        self._cap = args.tools.max_output_tokens
        self._reserve = args.tools.output_reserve_tokens
        self._context = args.max_context_tokens
        self._off_loop = off_loop or _Inline()

    def budget(self, context_tokens: int = 0, calls: int = 1) -> Budget:
        """Each of ``calls`` results' budget when ``context_tokens`` are in the context
        (the prompt and the completion that made the calls)."""
        left = max(0, self._context - context_tokens - self._reserve) // max(calls, 1)
        if left < self._cap:
            return Budget(left, by_context=True)
        return Budget(self._cap)

    async def apply(
        self, result: ToolResult, recipient: str, channel: str, budget: Budget, owner: str | None
    ) -> Bounded:
        """``result`` as the model is given it (or a failure saying why it is not), with its
        message's tokens. A result that awaits the client has no message."""
        if result.awaits_client:
            return Bounded(result)
        text = result.model_text
        try:
            tokens = await self._off_loop.tokens_of(
                tool_message_tokens, (recipient, channel, text, budget.tokens), len(text), owner
            )
        except LongPiece as piece:  # found before anything tokenized it
            return self._failed(result, _piece_reason(piece.length), recipient, channel)
        except TooManyTokens as over:  # a prefix alone was over: the rest never tokenized
            reason = budget.reason(over.tokens, at_least=True)
            return self._failed(result, reason, recipient, channel)
        except APIError as error:  # the owner's render bound, a worker that died
            logger.warning("a tool's output of %d characters not rendered: %s", len(text), error)
            reason = f"The tool's output could not be read now ({error.message})."
            return self._failed(result, reason, recipient, channel)
        if len(tokens) > budget.tokens:
            return self._failed(result, budget.reason(len(tokens)), recipient, channel)
        return Bounded(result, tokens)

    def _failed(self, result: ToolResult, reason: str, recipient: str, channel: str) -> Bounded:
        """The failure the model reads instead: short, so rendered here."""
        failed = ToolResult(error=reason, data=_small(result.data))
        return Bounded(failed, tool_message_tokens(recipient, channel, failed.model_text))


def _piece_reason(length: int) -> str:
    return (
        f"The tool's output holds {length:,} characters without a break (a run of one letter, "
        f"punctuation or whitespace), more than the {MAX_PIECE_CHARS:,} the model can be given "
        "in one piece: it was not passed on. Ask for it in another form."
    )


def _small(data: Mapping[str, Any]) -> dict[str, Any]:
    """The item's own fields a failed result keeps: short plain values (a page's URL, a
    search's sources, an approval's id), never the output that was refused (a python call's
    logs) nor an error object the failure replaces (an MCP call's ``mcp_error``)."""
    return {key: value for key, value in data.items() if _plain_and_short(value)}


def _plain_and_short(value: Any) -> bool:
    plain = isinstance(value, str | int | float | bool) or (
        isinstance(value, list) and all(isinstance(entry, str) for entry in value)
    )
    return plain and len(repr(value)) <= _KEPT_DATA_CHARS
