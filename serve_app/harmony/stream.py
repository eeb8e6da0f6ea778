"""Engine token ids -> harmony messages -> Responses output items and stream events.

The prompt ends with ``<|start|>assistant``, so the completion starts inside a message header
(``<|channel|>analysis<|message|>...``). Each harmony message becomes one output item (which
one: ``items.py``). The events (their order, sequence numbers, output indices, the Response)
are written by `ResponseEventWriter` (``protocol/stream_events.py``); this module decodes
harmony and tells it what each message opens, streams and closes.

``max_tool_calls``: once that many tool calls are done, the rest of the completion is not
translated (``tool_calls_exhausted`` tells the caller to stop the engine; `items.CallLimit`).
Calls of tools the server runs stay open at ``<|call|>`` (pending) for the tool loop
(serving/tools/loop.py), which runs them and feeds the next completion here (`begin_completion`).

A harmony ``StreamableParser`` decodes each message; this module drives it one message at a time
and recovers from malformed harmony (``recovery.py`` lists the cases). Logprobs: ``token_text.py``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence

from openai.types.responses import Response, ResponseOutputItem, ResponseStreamEvent
from openai.types.responses.response_output_text import Logprob as TextLogprob
from openai_harmony import HarmonyEncoding, Role, StreamableParser

from serve_app.harmony.encoding import CALL_TOKEN, FIRST_SPECIAL_TOKEN, get_encoding
from serve_app.harmony.items import (
    CallLimit,
    MessageText,
    UnknownCalls,
    current_text,
    final_text,
    open_item,
)
from serve_app.harmony.recovery import LooseHeader, header_is_text, parse_loose_header
from serve_app.harmony.token_text import structural_tokens, text_logprob, valid_token
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol import responses as builders
from serve_app.protocol.client_tools import OWED_CALL_TYPES
from serve_app.protocol.stream_events import (
    ItemKind,
    ItemStatus,
    OpenItem,
    ResponseEventWriter,
)
from serve_app.values import TokenLogprob

logger = logging.getLogger(__name__)

# A real header is a dozen tokens (`<|channel|>commentary to=functions.exec_command
# <|constrain|>json`); past this many, the model is writing text without a header.
MAX_HEADER_TOKENS = 64


class _State(enum.Enum):
    EXPECT_START = "expect_start"  # between messages
    HEADER = "header"  # reading a message header
    CONTENT = "content"  # streaming a message's content into an open item
    DONE = "done"  # a terminal event was emitted


class ResponseStreamTranslator:
    """Turns one response's completion token ids into Responses stream events.

    Use once per response: ``start()``, then ``feed()`` for each chunk of token ids, then
    exactly one of ``finish()`` or ``fail()``. None of them raises on malformed model output.
    """

    def __init__(
        self,
        response: Response,
        tools: ToolRegistry,
        *,
        seal_reasoning: Callable[[str], str] | None = None,
        summarize_reasoning: bool = False,
        max_tool_calls: int | None = None,
    ) -> None:
        self._encoding: HarmonyEncoding = get_encoding()
        self._tok = structural_tokens()
        self._response_id = response.id
        self._writer = ResponseEventWriter(
            response, seal_reasoning=seal_reasoning, summarize_reasoning=summarize_reasoning
        )
        self.tools = tools  # what recipients resolve to (a listing may add to it: MCP)
        self.call_limit = CallLimit(max_tool_calls)
        self.unknown_calls = UnknownCalls()  # calls of tools it lacks: no item (items.py)
        self._state = _State.EXPECT_START
        self._parser: StreamableParser | None = None
        # The current header's tokens (ours: the parser's copy is only reachable as JSON).
        self._header: list[int] = []
        self._header_after_start = False
        self._header_checked = False
        self._item: OpenItem | None = None
        # Logprobs of the open message's output_text tokens whose text no delta carried yet.
        self._pending: list[TextLogprob] = []
        self._text = MessageText()  # the open message's, not sent yet
        self._completion_tokens = 0
        self._reasoning_tokens = 0
        # The logprob entry of the token being stepped (None: the engine sent none).
        self._token_logprob: TokenLogprob | None = None
        # The current header's tokens with their entries (text, if the header turns out to be).
        self._header_logprobs: list[tuple[int, TokenLogprob]] = []

    # --- public API ----------------------------------------------------------------------

    @property
    def response(self) -> Response:
        """The in-progress template until a terminal event, then the final Response."""
        return self._writer.response

    @property
    def writer(self) -> ResponseEventWriter:
        """The response's event writer (a prewarm's, a compaction's item, the tool loop's)."""
        return self._writer

    @property
    def output_items(self) -> list[ResponseOutputItem]:
        """The items finished so far (``output_item.done`` sent), in output order."""
        return self._writer.output_items

    @property
    def tool_calls_exhausted(self) -> bool:
        """Whether ``max_tool_calls`` calls are done: what the engine writes next is dropped."""
        return self.call_limit.exhausted(self._writer.tool_calls)

    def start(self) -> list[ResponseStreamEvent]:
        """``response.created`` then ``response.in_progress`` (nothing once started)."""
        self._writer.start()
        return self._writer.take_events()

    @property
    def ended(self) -> bool:
        """Whether the terminal event was made (`finish` or `fail`)."""
        return self._state is _State.DONE

    @property
    def at_safe_boundary(self) -> bool:
        """Between two messages, the last one not a tool call (whose output the client owes):
        where a response can end without cutting an item (steering's boundary)."""
        if self._state is not _State.EXPECT_START or self._writer.pending_calls:
            return False
        items = self._writer.output_items
        return not items or items[-1].type not in OWED_CALL_TYPES

    def begin_completion(self) -> None:
        """The tool loop's next completion (again after ``<|start|>assistant``): numbered on."""
        if self._state is not _State.DONE:
            self._close_all("completed", ending=False)
            self.call_limit.begin(self._writer.tool_calls)
        self.unknown_calls.clear()

    def take_sequence(self) -> int:
        """The stream's next sequence number, for an event that joins it (steering's)."""
        return self._writer.take_sequence()

    def feed(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] | None = None
    ) -> list[ResponseStreamEvent]:
        """Events for the next completion tokens (possibly none). ``logprobs``: one entry per
        token (a `GenerateChunk`'s), when the request asked for them."""
        return self._feed(token_ids, logprobs, to_boundary=False)[0]

    def feed_to_boundary(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] | None = None
    ) -> tuple[list[ResponseStreamEvent], int]:
        """As `feed`, stopping at the first safe boundary (`at_safe_boundary`; at once when
        already at one): the events and how many of ``token_ids`` were read."""
        return self._feed(token_ids, logprobs, to_boundary=True)

    def _feed(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[TokenLogprob] | None,
        *,
        to_boundary: bool,
    ) -> tuple[list[ResponseStreamEvent], int]:
        if self._state is _State.DONE:
            if token_ids:
                logger.warning("response %s: tokens after the end ignored", self._response_id)
            return [], 0
        writer = self._writer
        writer.start()
        limit = self.call_limit if self.call_limit.limit is not None else None
        read = 0
        for index, token in enumerate(token_ids):
            if to_boundary and self.at_safe_boundary:
                break
            read = index + 1
            if logprobs is not None:
                self._token_logprob = logprobs[index] if index < len(logprobs) else None
            self._completion_tokens += 1
            if limit is not None and limit.exhausted(writer.tool_calls):
                continue  # generated (and counted), but past the last call allowed
            try:
                self._step(int(token))
            except Exception:
                # A bug of ours must not break the stream: end the message, go on.
                logger.exception("response %s: token %r not translated", self._response_id, token)
                self._abandon_message()
        try:
            self._flush()
        except Exception:
            logger.exception("response %s: delta not translated", self._response_id)
            self._abandon_message()
        return writer.take_events(), read

    def finish(
        self, finish_reason: str, *, prompt_tokens: int, cached_tokens: int
    ) -> list[ResponseStreamEvent]:
        """Close what is open and emit the terminal event for the engine's finish reason.

        ``stop``: ``response.completed``. ``length``: ``response.incomplete`` with reason
        ``max_output_tokens``, the open item ``incomplete``. ``abort`` (the request was
        cancelled, usually because the client went away): OpenAI marks cancelled responses
        ``status: "cancelled"`` and has no ``response.cancelled`` stream event, so we send
        ``response.incomplete`` carrying a ``cancelled`` response with null
        ``incomplete_details`` (its reason has no value for cancellation). ``error``: as
        ``fail()``. Ours, ``steered`` (at a safe boundary) and ``content_filter`` (moderation
        blocked it): ``response.incomplete`` with that reason. Else logged, taken as ``stop``.
        """
        if self._state is _State.DONE:
            return []
        if finish_reason == "error":
            return self.fail("The engine failed while generating.")
        self._writer.start()
        aborted = finish_reason in ("length", "abort", "content_filter")
        self._close_all("incomplete" if aborted else "completed")
        usage = builders.usage(
            prompt_tokens, cached_tokens, self._completion_tokens, self._reasoning_tokens
        )
        if finish_reason == "length":
            self._writer.finish("incomplete", usage, incomplete_reason="max_output_tokens")
        elif finish_reason in ("steered", "content_filter"):
            self._writer.finish("incomplete", usage, incomplete_reason=finish_reason)
        elif finish_reason == "abort":
            self._writer.finish("cancelled", usage)
        else:
            if finish_reason != "stop":
                logger.warning("unknown finish reason %r treated as stop", finish_reason)
            self._writer.finish("completed", usage)
        return self._writer.take_events()

    def fail(self, message: str, code: str = "server_error") -> list[ResponseStreamEvent]:
        """Close open items as ``incomplete`` and emit ``response.failed`` with ``error``."""
        if self._state is _State.DONE:
            return []
        self._writer.start()
        self._close_all("incomplete")
        self._writer.fail(code, message)
        return self._writer.take_events()

    def fail_ended(self, message: str, code: str = "server_error") -> ResponseStreamEvent:
        """After `finish` or `fail`: the response failed after all (it could not be stored),
        and the ``response.failed`` that replaces the terminal event they returned."""
        return self._writer.fail_ended(code, message)

    # --- token state machine -------------------------------------------------------------

    def _step(self, token: int) -> None:
        if not valid_token(token):
            logger.info("response %s: dropped invalid token id %d", self._response_id, token)
            return
        if self._state is _State.EXPECT_START:
            self._begin_message(token)
        elif self._state is _State.HEADER:
            self._header_token(token)
        elif self._state is _State.CONTENT:
            self._content_token(token)

    def _begin_message(self, token: int) -> None:
        if token in self._tok.stops:
            return  # a stray end marker between messages carries nothing
        self._header = []
        self._header_logprobs = []
        self._header_checked = False
        self._state = _State.HEADER
        if token == self._tok.start:
            # The role follows as text; the parser reads it from the header.
            self._parser = StreamableParser(self._encoding, None)
            self._parser.process(token)
            self._header_after_start = True
            return
        # No `<|start|>assistant` (e.g. right after `<|call|>`): read on as if it were there.
        self._parser = StreamableParser(self._encoding, Role.ASSISTANT)
        self._header_after_start = False
        self._header_token(token)

    def _header_token(self, token: int) -> None:
        if token in self._tok.stops:
            # The header never reached `<|message|>`: keep what it says (`to=x<|call|>` is a
            # call without arguments).
            self._salvage_header("completed", allow_empty_call=token == CALL_TOKEN)
            return
        if token == self._tok.start:
            self._salvage_header("completed")
            self._begin_message(token)
            return
        if token == self._tok.message:
            self._end_header(token)
            return
        self._header.append(token)
        if self._token_logprob is not None:
            self._header_logprobs.append((token, self._token_logprob))
        try:
            self._require_parser().process(token)
        except Exception:
            self._open_loose(header_complete=False)
            return
        if len(self._header) > MAX_HEADER_TOKENS or self._is_plain_text():
            self._open_loose(header_complete=False)

    def _end_header(self, token: int) -> None:
        parser = self._require_parser()
        try:
            parser.process(token)
        except Exception as exc:
            logger.info("response %s: malformed header (%s)", self._response_id, exc)
            self._open_loose(header_complete=True)
            return
        self._text = MessageText()
        self._open_item(parser.current_channel, parser.current_recipient)
        self._state = _State.CONTENT

    def _is_plain_text(self) -> bool:
        """Whether the header so far is ordinary text, not a header (checked once)."""
        if self._header_checked or self._header_after_start:
            return False
        if any(token >= FIRST_SPECIAL_TOKEN for token in self._header):
            self._header_checked = True
            return False
        is_text = header_is_text(self._encoding.decode(self._header))
        self._header_checked = is_text is not None
        return bool(is_text)

    def _content_token(self, token: int) -> None:
        if token in self._tok.stops:
            self._close_message("completed", stop_token=token)
            return
        if token in (self._tok.start, self._tok.channel):
            # The model began a new message without ending this one.
            self._close_message("completed")
            self._begin_message(token)
            return
        parser = self._parser
        try:
            if parser is None:  # `_require_parser`, inlined: once per token
                raise RuntimeError("no harmony parser for the current message")
            parser.process(token)
        except Exception as exc:
            logger.info("response %s: content not parsed (%s)", self._response_id, exc)
            self._close_message("incomplete", broken=True)
            return
        self._text.add(parser)
        item = self._item
        if item is not None and item.kind is ItemKind.REASONING:
            self._reasoning_tokens += 1
        elif self._token_logprob is not None and item is not None and item.kind is ItemKind.MESSAGE:
            self._pending.append(text_logprob(token, self._token_logprob))

    # --- recovery ------------------------------------------------------------------------

    def _loose_header(self) -> LooseHeader:
        return parse_loose_header(
            self._encoding.decode(self._header), leading_role=self._header_after_start
        )

    def _open_loose(self, *, header_complete: bool) -> None:
        """Open an item from a header the parser did not accept; content streams on.

        ``header_complete``: `<|message|>` was seen, so what follows the fields is junk in
        the header; otherwise it is the message's first content.
        """
        header = self._loose_header()
        parser = StreamableParser(self._encoding, Role.ASSISTANT)
        for token in self._tok.content_header:
            parser.process(token)
        salvaged = not header_complete and header.had_fields
        plain_text = not header_complete and not header.had_fields
        self._text = MessageText(header.rest if salvaged else "")
        if plain_text:
            # Let harmony decode the tokens (a character split across tokens would be lost
            # to a lossy decode of the first ones).
            for token in self._header:
                parser.process(token)
                self._text.add(parser)
        self._parser = parser
        self._open_item(header.channel, header.recipient)
        self._state = _State.CONTENT
        item = self._item
        if plain_text and item is not None and item.kind is ItemKind.MESSAGE:
            # The "header" tokens are the message's first text.
            self._pending.extend(text_logprob(t, e) for t, e in self._header_logprobs)

    def _salvage_header(self, status: ItemStatus, *, allow_empty_call: bool = False) -> None:
        """End a header that never reached `<|message|>`: an item if it says anything."""
        header = self._loose_header()
        wanted = bool(header.rest.strip()) or (allow_empty_call and header.recipient)
        if wanted:
            self._open_loose(header_complete=False)
            self._close_message(status)
        self._reset_message()

    def _abandon_message(self) -> None:
        """After an unexpected error of ours: close the open item as it is, start over."""
        try:
            if self._item is not None:
                self._writer.close(self._item, "incomplete", self._pending)
        finally:
            self._reset_message()

    def _reset_message(self) -> None:
        self._parser = None
        self._item = None
        self._pending = []
        self._header = []
        self._header_logprobs = []
        self._text = MessageText()
        self._state = _State.EXPECT_START

    def _close_all(self, status: ItemStatus, *, ending: bool = True) -> None:
        try:
            if self._state is _State.HEADER:
                self._salvage_header(status)
            elif self._state is _State.CONTENT:
                self._close_message(status)
            if ending:
                self._writer.close_pending_calls("incomplete")
        except Exception:
            logger.exception("response %s: open item not closed cleanly", self._response_id)
            self._abandon_message()
        self._reset_message()
        if ending:
            self._state = _State.DONE

    # --- items -----------------------------------------------------------------------------

    def _open_item(self, channel: str | None, recipient: str | None) -> None:
        # Open only once announced, so recovery never closes an item the client never saw.
        self._pending = []
        refused = self.call_limit.refuses(self._writer.tool_calls, recipient)
        hidden = self.unknown_calls.hides(self._writer, self.tools, channel, recipient, refused)
        self._item = None if hidden else open_item(self._writer, self.tools, channel, recipient)

    def _flush(self) -> None:
        """Send the open item's text decoded since the last delta, as one delta."""
        item = self._item
        if self._state is not _State.CONTENT or item is None:
            return
        delta = self._text.take()
        if delta:
            self._send(item, delta)

    def _send_rest(self, item: OpenItem, text: str) -> None:
        """Send what ``text`` (the item's whole content, at its end) adds to what was sent."""
        sent = item.text
        if len(text) <= len(sent):
            return
        if not text.startswith(sent):
            # Never happens with harmony's decoder; a delta cannot be taken back, so keep
            # what was sent rather than send text that contradicts it.
            logger.error("response %s: content changed under the stream", self._response_id)
            return
        self._send(item, text[len(sent) :])

    def _send(self, item: OpenItem, delta: str) -> None:
        """One delta, with the logprobs of the tokens whose text first shows in it."""
        self._writer.text(item, delta, self._pending)
        if self._pending:
            self._pending = []

    def _close_message(
        self, status: ItemStatus, *, stop_token: int | None = None, broken: bool = False
    ) -> None:
        item = self._item
        if item is None:
            self.unknown_calls.end(self._writer, made=status == "completed")
            self._reset_message()
            return
        final = self._closing_text(stop_token, broken=broken)
        if final is not None:
            self._send_rest(item, final)
        self._writer.close(item, status, self._pending)
        self._reset_message()

    def _closing_text(self, stop_token: int | None, *, broken: bool) -> str | None:
        """The message's whole text per harmony (with a trailing partial character); when it
        is ``broken`` or harmony cannot finalise it, what was decoded of it so far."""
        text = None if broken else final_text(self._require_parser(), stop_token, self._response_id)
        text = current_text(self._parser) if text is None else text
        return None if text is None else self._text.prefix + text

    def _require_parser(self) -> StreamableParser:
        if self._parser is None:
            raise RuntimeError("no harmony parser for the current message")
        return self._parser
