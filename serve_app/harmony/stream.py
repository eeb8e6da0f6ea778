"""Engine token ids -> Responses output items and stream events.

The prompt ends with ``<|start|>assistant``, so the completion starts inside a message header
(``<|channel|>analysis<|message|>...``). Each harmony message becomes one output item:

- ``analysis`` without a recipient: a ``reasoning`` item (``content: [reasoning_text]``; with
  ``summarize_reasoning``, also ``summary: [summary_text]`` holding the same text, since gpt-oss
  writes no summary and clients that show reasoning read only summaries);
- ``final`` (or no channel): a ``message`` with ``phase: "final_answer"``;
- ``commentary`` without a recipient: a ``message`` with ``phase: "commentary"`` (a preamble);
- any channel with a recipient: a ``custom_tool_call`` when the recipient resolves to a custom
  tool, else a ``function_call`` (unknown recipients too: the client answers them with an error
  output, which the model can read, rather than the turn vanishing).

Events follow OpenAI's order: ``output_item.added`` -> (``content_part.added`` -> deltas ->
``*.done`` -> ``content_part.done``) or (argument/input deltas -> ``*.done``) ->
``output_item.done`` with the complete item, and exactly one terminal event. A summarized
reasoning item also opens summary part 0 (``reasoning_summary_part.added``) after its content
part, sends each ``reasoning_text.delta`` again as a ``reasoning_summary_text.delta``, and
closes it (``reasoning_summary_text.done``, ``reasoning_summary_part.done``) after its content
part, before ``output_item.done``.

``max_tool_calls``: once that many tool calls are done, the rest of the completion is not
translated (``tool_calls_exhausted`` tells the caller to stop the engine) and the response ends
with the calls made so far.

A harmony ``StreamableParser`` (``strict=True``) decodes each message; this module drives it
one message at a time and owns recovery, because models emit malformed harmony and the parser
raises on it. The parser's ``strict=False`` mode only changes one case (a stop token inside a
header): it then joins the header words with single spaces and drops the recipient. Our own
salvage of such headers keeps the text as written and still recovers tool calls, so we parse
strictly and handle these cases here:

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

Logprobs (when the engine's chunks carry them, i.e. the request included
``message.output_text.logprobs``): only the content tokens of ``message`` items (the
``output_text``) get entries; header, stop and reasoning or tool-call tokens get none. A token's
entry rides on the ``output_text.delta`` that first carries its text (a token that ends inside
a UTF-8 character waits for the next one), and the part, ``output_text.done``, the done item and
the final Response hold them all. Token text and bytes are decoded per token with harmony's
encoding, bytes exactly: a token that splits a character keeps its bytes, and its ``token``
shows U+FFFD.
"""

from __future__ import annotations

import enum
import functools
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCustomToolCall,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryPartDoneEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningSummaryTextDoneEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_content_part_added_event import (
    PartReasoningText as AddedReasoningPart,
)
from openai.types.responses.response_content_part_done_event import (
    PartReasoningText as DoneReasoningPart,
)
from openai.types.responses.response_error import ResponseError
from openai.types.responses.response_output_text import Logprob as TextLogprob
from openai.types.responses.response_output_text import LogprobTopLogprob as TextTopLogprob
from openai.types.responses.response_reasoning_item import Content as ReasoningContent
from openai.types.responses.response_reasoning_item import Summary as ReasoningSummary
from openai.types.responses.response_reasoning_summary_part_added_event import (
    Part as AddedSummaryPart,
)
from openai.types.responses.response_reasoning_summary_part_done_event import (
    Part as DoneSummaryPart,
)
from openai.types.responses.response_text_delta_event import Logprob as DeltaLogprob
from openai.types.responses.response_text_delta_event import (
    LogprobTopLogprob as DeltaTopLogprob,
)
from openai.types.responses.response_text_done_event import Logprob as DoneLogprob
from openai.types.responses.response_text_done_event import LogprobTopLogprob as DoneTopLogprob
from openai_harmony import HarmonyEncoding, Message, Role, StreamableParser
from pydantic import ValidationError

from serve_app.engines.base import TokenLogprob
from serve_app.harmony.encoding import CALL_TOKEN, END_TOKEN, RETURN_TOKEN, get_encoding
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol import responses as builders

logger = logging.getLogger(__name__)

ItemStatus = Literal["completed", "incomplete"]

# A real header is a dozen tokens (`<|channel|>commentary to=functions.exec_command
# <|constrain|>json`); past this many, the model is writing text without a header.
MAX_HEADER_TOKENS = 64
# o200k's ordinary tokens are 0..199997; special and reserved ids follow.
_FIRST_SPECIAL_ID = 199998

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
_ROLE_RECIPIENTS = {"assistant", "user", "system", "developer"}


@dataclass(frozen=True)
class _Tokens:
    start: int
    channel: int
    message: int
    stops: frozenset[int]
    # `<|channel|>final<|message|>`: puts a fresh parser into content state.
    content_header: tuple[int, ...]


@functools.cache
def _tokens() -> _Tokens:
    encoding = get_encoding()

    def special(text: str) -> list[int]:
        return encoding.encode(text, allowed_special="all")

    return _Tokens(
        start=special("<|start|>")[0],
        channel=special("<|channel|>")[0],
        message=special("<|message|>")[0],
        stops=frozenset((END_TOKEN, RETURN_TOKEN, CALL_TOKEN)),
        content_header=tuple(special("<|channel|>final<|message|>")),
    )


@functools.lru_cache(maxsize=4096)
def _decodable(token: int) -> bool:
    try:
        get_encoding().decode([token])
    except Exception:
        return False
    return True


@functools.lru_cache(maxsize=65536)
def _token_text(token: int) -> tuple[str, tuple[int, ...]]:
    """A token's text and exact bytes (a piece of a UTF-8 character shows as U+FFFD)."""
    try:
        # surrogateescape round-trips undecodable bytes: harmony's public decode, exact bytes.
        data = get_encoding().decode([token], errors="surrogateescape").encode(
            "utf-8", errors="surrogateescape"
        )
    except Exception:
        return "", ()
    return data.decode("utf-8", errors="replace"), tuple(data)


def _text_logprob(token: int, entry: TokenLogprob) -> TextLogprob:
    logprob, alternatives = entry
    text, data = _token_text(token)
    top = []
    for alternative, value in alternatives:
        alt_text, alt_data = _token_text(alternative)
        top.append(TextTopLogprob(token=alt_text, bytes=list(alt_data), logprob=value))
    return TextLogprob(token=text, bytes=list(data), logprob=logprob, top_logprobs=top)


def _delta_logprob(entry: TextLogprob) -> DeltaLogprob:
    top = [DeltaTopLogprob(token=alt.token, logprob=alt.logprob) for alt in entry.top_logprobs]
    return DeltaLogprob(token=entry.token, logprob=entry.logprob, top_logprobs=top)


def _done_logprob(entry: TextLogprob) -> DoneLogprob:
    top = [DoneTopLogprob(token=alt.token, logprob=alt.logprob) for alt in entry.top_logprobs]
    return DoneLogprob(token=entry.token, logprob=entry.logprob, top_logprobs=top)


def _valid_token(token: int) -> bool:
    return 0 <= token < _FIRST_SPECIAL_ID or (token >= 0 and _decodable(token))


class _State(enum.Enum):
    EXPECT_START = "expect_start"  # between messages
    HEADER = "header"  # reading a message header
    CONTENT = "content"  # streaming a message's content into an open item
    DONE = "done"  # a terminal event was emitted


class _Kind(enum.Enum):
    REASONING = "reasoning"
    MESSAGE = "message"
    FUNCTION_CALL = "function_call"
    CUSTOM_TOOL_CALL = "custom_tool_call"


@dataclass
class _OpenItem:
    kind: _Kind
    item_id: str
    output_index: int
    phase: Literal["commentary", "final_answer"] | None = None
    name: str = ""
    call_id: str = ""
    namespace: str | None = None
    # Content sent in deltas so far.
    text: str = ""
    # Logprobs of output_text tokens: sent in deltas, and not yet (no text of theirs yet).
    logprobs: list[TextLogprob] = field(default_factory=list)
    pending: list[TextLogprob] = field(default_factory=list)

    def sent_logprobs(self) -> list[TextLogprob]:
        """All of them, for the done events: what no delta carried comes last."""
        self.logprobs.extend(self.pending)
        self.pending = []
        return list(self.logprobs)


@dataclass(frozen=True)
class _LooseHeader:
    channel: str | None
    recipient: str | None
    # Text after the header fields (content, when the header never reached `<|message|>`).
    rest: str
    # Whether any header field was recognised (else the "header" was plain text).
    had_fields: bool


def _parse_loose_header(text: str, *, leading_role: bool) -> _LooseHeader:
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
    return _LooseHeader(channel, recipient, rest.lstrip() if had_fields else rest, had_fields)


def _message_text(message: Message) -> str:
    return "".join(getattr(part, "text", "") or "" for part in message.content)


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
        self._tok = _tokens()
        self._template = response
        self._response = response
        self._tools = tools
        self._seal = seal_reasoning
        self._summarize = summarize_reasoning
        self._max_tool_calls = max_tool_calls
        self._tool_calls = 0
        self._sequence = 0
        self._started = False
        self._state = _State.EXPECT_START
        self._parser: StreamableParser | None = None
        # The current header's tokens (ours: the parser's copy is only reachable as JSON).
        self._header: list[int] = []
        self._header_after_start = False
        self._header_checked = False
        self._item: _OpenItem | None = None
        # Salvaged text that precedes what the current parser decodes.
        self._prefix = ""
        self._dirty = False
        self._items: list[ResponseOutputItem] = []
        self._next_output_index = 0
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
        return self._response

    @property
    def output_items(self) -> list[ResponseOutputItem]:
        """The items finished so far (``output_item.done`` sent), in output order."""
        return list(self._items)

    @property
    def tool_calls_exhausted(self) -> bool:
        """Whether ``max_tool_calls`` calls are done: what the engine writes next is dropped."""
        return self._max_tool_calls is not None and self._tool_calls >= self._max_tool_calls

    def start(self) -> list[ResponseStreamEvent]:
        """``response.created`` then ``response.in_progress``."""
        if self._started:
            return []
        self._started = True
        return [
            ResponseCreatedEvent(
                type="response.created", response=self._template, sequence_number=self._seq()
            ),
            ResponseInProgressEvent(
                type="response.in_progress",
                response=self._template,
                sequence_number=self._seq(),
            ),
        ]

    def feed(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] | None = None
    ) -> list[ResponseStreamEvent]:
        """Events for the next completion tokens (possibly none). ``logprobs``: one entry per
        token (a `GenerateChunk`'s), when the request asked for them."""
        if self._state is _State.DONE:
            if token_ids:
                logger.warning("response %s: tokens after the end ignored", self._template.id)
            return []
        events = self.start()
        for index, token in enumerate(token_ids):
            if logprobs is not None:
                self._token_logprob = logprobs[index] if index < len(logprobs) else None
            self._completion_tokens += 1
            if self.tool_calls_exhausted:
                continue  # generated (and counted), but past the last call allowed
            try:
                self._step(int(token), events)
            except Exception:
                # A bug of ours must not break the stream: end the message, go on.
                logger.exception("response %s: token %r not translated", self._template.id, token)
                self._abandon_message(events)
        try:
            self._flush(events)
        except Exception:
            logger.exception("response %s: delta not translated", self._template.id)
            self._abandon_message(events)
        return events

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
        ``fail()``. Anything else is logged and treated as ``stop``.
        """
        if self._state is _State.DONE:
            return []
        if finish_reason == "error":
            return self.fail("The engine failed while generating.")
        events = self.start()
        aborted = finish_reason in ("length", "abort")
        self._close_all(events, "incomplete" if aborted else "completed")
        fields: dict[str, Any] = {
            "output": list(self._items),
            "usage": builders.usage(
                prompt_tokens, cached_tokens, self._completion_tokens, self._reasoning_tokens
            ),
        }
        if finish_reason == "length":
            fields["status"] = "incomplete"
            fields["incomplete_details"] = IncompleteDetails(reason="max_output_tokens")
        elif finish_reason == "abort":
            fields["status"] = "cancelled"
        else:
            if finish_reason != "stop":
                logger.warning("unknown finish reason %r treated as stop", finish_reason)
            fields["status"] = "completed"
            fields["completed_at"] = int(time.time())
        self._response = self._template.model_copy(update=fields)
        if fields["status"] == "completed":
            terminal: ResponseStreamEvent = ResponseCompletedEvent(
                type="response.completed", response=self._response, sequence_number=self._seq()
            )
        else:
            terminal = ResponseIncompleteEvent(
                type="response.incomplete", response=self._response, sequence_number=self._seq()
            )
        events.append(terminal)
        return events

    def fail(self, message: str, code: str = "server_error") -> list[ResponseStreamEvent]:
        """Close open items as ``incomplete`` and emit ``response.failed`` with ``error``."""
        if self._state is _State.DONE:
            return []
        events = self.start()
        self._close_all(events, "incomplete")
        self._response = self._template.model_copy(
            update={
                "status": "failed",
                "error": _response_error(code, message),
                "output": list(self._items),
            }
        )
        events.append(
            ResponseFailedEvent(
                type="response.failed", response=self._response, sequence_number=self._seq()
            )
        )
        return events

    # --- token state machine -------------------------------------------------------------

    def _step(self, token: int, events: list[ResponseStreamEvent]) -> None:
        if not _valid_token(token):
            logger.info("response %s: dropped invalid token id %d", self._template.id, token)
            return
        if self._state is _State.EXPECT_START:
            self._begin_message(token, events)
        elif self._state is _State.HEADER:
            self._header_token(token, events)
        elif self._state is _State.CONTENT:
            self._content_token(token, events)

    def _begin_message(self, token: int, events: list[ResponseStreamEvent]) -> None:
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
        self._header_token(token, events)

    def _header_token(self, token: int, events: list[ResponseStreamEvent]) -> None:
        if token in self._tok.stops:
            # The header never reached `<|message|>`: keep what it says (`to=x<|call|>` is a
            # call without arguments).
            self._salvage_header(events, "completed", allow_empty_call=token == CALL_TOKEN)
            return
        if token == self._tok.start:
            self._salvage_header(events, "completed")
            self._begin_message(token, events)
            return
        if token == self._tok.message:
            self._end_header(token, events)
            return
        self._header.append(token)
        if self._token_logprob is not None:
            self._header_logprobs.append((token, self._token_logprob))
        try:
            self._require_parser().process(token)
        except Exception:
            self._open_loose(events, header_complete=False)
            return
        if len(self._header) > MAX_HEADER_TOKENS or self._is_plain_text():
            self._open_loose(events, header_complete=False)

    def _end_header(self, token: int, events: list[ResponseStreamEvent]) -> None:
        parser = self._require_parser()
        try:
            parser.process(token)
        except Exception as exc:
            logger.info("response %s: malformed header (%s)", self._template.id, exc)
            self._open_loose(events, header_complete=True)
            return
        self._prefix = ""
        self._open_item(parser.current_channel, parser.current_recipient, events)
        self._state = _State.CONTENT

    def _is_plain_text(self) -> bool:
        """Whether the header so far is ordinary text, not a header (checked once)."""
        if self._header_checked or self._header_after_start:
            return False
        if any(token >= _FIRST_SPECIAL_ID for token in self._header):
            self._header_checked = True
            return False
        text = self._encoding.decode(self._header).lstrip()
        if not text or "to=".startswith(text):
            return False  # too early to tell
        self._header_checked = True
        # A header without a special token can only be a recipient: ` to=functions.x`.
        return not text.startswith("to=")

    def _content_token(self, token: int, events: list[ResponseStreamEvent]) -> None:
        if token in self._tok.stops:
            self._close_message(events, "completed", stop_token=token)
            return
        if token in (self._tok.start, self._tok.channel):
            # The model began a new message without ending this one.
            self._close_message(events, "completed")
            self._begin_message(token, events)
            return
        try:
            self._require_parser().process(token)
        except Exception as exc:
            logger.info("response %s: content not parsed (%s)", self._template.id, exc)
            self._close_message(events, "incomplete", broken=True)
            return
        self._dirty = True
        item = self._item
        if item is not None and item.kind is _Kind.REASONING:
            self._reasoning_tokens += 1
        elif self._token_logprob is not None and item is not None and item.kind is _Kind.MESSAGE:
            item.pending.append(_text_logprob(token, self._token_logprob))

    # --- recovery ------------------------------------------------------------------------

    def _loose_header(self) -> _LooseHeader:
        return _parse_loose_header(
            self._encoding.decode(self._header), leading_role=self._header_after_start
        )

    def _open_loose(self, events: list[ResponseStreamEvent], *, header_complete: bool) -> None:
        """Open an item from a header the parser did not accept; content streams on.

        ``header_complete``: `<|message|>` was seen, so what follows the fields is junk in
        the header; otherwise it is the message's first content.
        """
        header = self._loose_header()
        parser = StreamableParser(self._encoding, Role.ASSISTANT)
        for token in self._tok.content_header:
            parser.process(token)
        self._prefix = ""
        if not header_complete:
            if header.had_fields:
                self._prefix = header.rest
            else:
                # Plain text: let harmony decode the tokens (a character split across
                # tokens would be lost to a lossy decode of the first ones).
                for token in self._header:
                    parser.process(token)
        self._parser = parser
        self._open_item(header.channel, header.recipient, events)
        self._state = _State.CONTENT
        self._dirty = True
        item = self._item
        plain_text = not header_complete and not header.had_fields
        if plain_text and item is not None and item.kind is _Kind.MESSAGE:
            # The "header" tokens are the message's first text.
            item.pending.extend(_text_logprob(t, e) for t, e in self._header_logprobs)

    def _salvage_header(
        self,
        events: list[ResponseStreamEvent],
        status: ItemStatus,
        *,
        allow_empty_call: bool = False,
    ) -> None:
        """End a header that never reached `<|message|>`: an item if it says anything."""
        header = self._loose_header()
        wanted = bool(header.rest.strip()) or (allow_empty_call and header.recipient)
        if wanted:
            self._open_loose(events, header_complete=False)
            self._close_message(events, status)
        self._reset_message()

    def _abandon_message(self, events: list[ResponseStreamEvent]) -> None:
        """After an unexpected error of ours: close the open item as it is, start over."""
        try:
            if self._item is not None:
                self._emit_done(self._item, self._item.text, "incomplete", events)
        finally:
            self._reset_message()

    def _reset_message(self) -> None:
        self._parser = None
        self._item = None
        self._header = []
        self._header_logprobs = []
        self._prefix = ""
        self._dirty = False
        self._state = _State.EXPECT_START

    def _close_all(self, events: list[ResponseStreamEvent], status: ItemStatus) -> None:
        try:
            if self._state is _State.HEADER:
                self._salvage_header(events, status)
            elif self._state is _State.CONTENT:
                self._close_message(events, status)
        except Exception:
            logger.exception("response %s: open item not closed cleanly", self._template.id)
            self._abandon_message(events)
        self._reset_message()
        self._state = _State.DONE

    # --- items and their events ----------------------------------------------------------

    def _open_item(
        self, channel: str | None, recipient: str | None, events: list[ResponseStreamEvent]
    ) -> None:
        item = self._new_item(channel, recipient)
        events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                output_index=item.output_index,
                item=self._item_model(item, "", "in_progress", done=False),
                sequence_number=self._seq(),
            )
        )
        if item.kind is _Kind.MESSAGE:
            part: Any = _output_text("")
        elif item.kind is _Kind.REASONING:
            part = AddedReasoningPart(type="reasoning_text", text="")
        else:
            part = None
        if part is not None:
            events.append(
                ResponseContentPartAddedEvent(
                    type="response.content_part.added",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    content_index=0,
                    part=part,
                    sequence_number=self._seq(),
                )
            )
        if self._summarized(item):
            events.append(
                ResponseReasoningSummaryPartAddedEvent(
                    type="response.reasoning_summary_part.added",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    summary_index=0,
                    part=AddedSummaryPart(type="summary_text", text=""),
                    sequence_number=self._seq(),
                )
            )
        # Open only once announced, so recovery never closes an item the client never saw.
        self._item = item

    def _new_item(self, channel: str | None, recipient: str | None) -> _OpenItem:
        index = self._next_output_index
        self._next_output_index += 1
        target = (recipient or "").strip()
        if target.startswith("<|"):
            # `<|channel|>final <|constrain|>json<|message|>`: harmony's parser reports the
            # content type as the recipient. A recipient is a name (`to=NAME`), never a token.
            target = ""
        if target and target not in _ROLE_RECIPIENTS:
            spec = self._tools.resolve(target)
            custom = spec is not None and spec.kind == "custom"
            return _OpenItem(
                kind=_Kind.CUSTOM_TOOL_CALL if custom else _Kind.FUNCTION_CALL,
                item_id=(
                    builders.new_custom_tool_call_id()
                    if custom
                    else builders.new_function_call_id()
                ),
                output_index=index,
                name=spec.name if spec is not None else _bare_name(target),
                call_id=builders.new_call_id(),
                namespace=spec.namespace if spec is not None else None,
            )
        if channel == "analysis":
            return _OpenItem(_Kind.REASONING, builders.new_reasoning_id(), index)
        phase: Literal["commentary", "final_answer"] = (
            "commentary" if channel == "commentary" else "final_answer"
        )
        return _OpenItem(_Kind.MESSAGE, builders.new_message_id(), index, phase=phase)

    def _flush(self, events: list[ResponseStreamEvent]) -> None:
        """Send the open item's new content, measured as growth of the decoded text.

        ``last_content_delta`` is None while a UTF-8 character is split across tokens, so the
        parser's whole ``current_content`` is compared with what was sent instead.
        """
        item = self._item
        if self._state is not _State.CONTENT or item is None or not self._dirty:
            return
        self._dirty = False
        text = self._prefix + self._require_parser().current_content
        self._send_delta(item, text, events)

    def _send_delta(self, item: _OpenItem, text: str, events: list[ResponseStreamEvent]) -> None:
        if len(text) <= len(item.text):
            return
        if not text.startswith(item.text):
            # Never happens with harmony's decoder; a delta cannot be taken back, so keep
            # what was sent rather than send text that contradicts it.
            logger.error("response %s: content changed under the stream", self._template.id)
            return
        delta = text[len(item.text) :]
        item.text = text
        events.append(self._delta_event(item, delta))
        if self._summarized(item):
            events.append(
                ResponseReasoningSummaryTextDeltaEvent(
                    type="response.reasoning_summary_text.delta",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    summary_index=0,
                    delta=delta,
                    sequence_number=self._seq(),
                )
            )

    def _close_message(
        self,
        events: list[ResponseStreamEvent],
        status: ItemStatus,
        *,
        stop_token: int | None = None,
        broken: bool = False,
    ) -> None:
        item = self._item
        if item is None:
            self._reset_message()
            return
        final = None if broken else self._final_text(stop_token)
        if final is None:
            final = self._current_text()
        if final is not None:
            self._send_delta(item, final, events)
        self._emit_done(item, item.text, status, events)
        self._reset_message()

    def _final_text(self, stop_token: int | None) -> str | None:
        """The message's whole text per harmony (includes a trailing partial character)."""
        parser = self._require_parser()
        try:
            if stop_token is None:
                parser.process_eos()
            else:
                parser.process(stop_token)
            messages = parser.messages
        except Exception as exc:
            logger.info("response %s: message not finalised (%s)", self._template.id, exc)
            return None
        return self._prefix + _message_text(messages[-1]) if messages else None

    def _current_text(self) -> str | None:
        try:
            return self._prefix + self._require_parser().current_content
        except Exception:
            return None

    def _emit_done(
        self,
        item: _OpenItem,
        text: str,
        status: ItemStatus,
        events: list[ResponseStreamEvent],
    ) -> None:
        common: dict[str, Any] = {"item_id": item.item_id, "output_index": item.output_index}
        if item.kind is _Kind.MESSAGE:
            logprobs = item.sent_logprobs()
            events.append(
                ResponseTextDoneEvent(
                    type="response.output_text.done",
                    content_index=0,
                    text=text,
                    logprobs=[_done_logprob(entry) for entry in logprobs],
                    sequence_number=self._seq(),
                    **common,
                )
            )
            events.append(self._part_done(_output_text(text, logprobs), common))
        elif item.kind is _Kind.REASONING:
            events.append(
                ResponseReasoningTextDoneEvent(
                    type="response.reasoning_text.done",
                    content_index=0,
                    text=text,
                    sequence_number=self._seq(),
                    **common,
                )
            )
            events.append(
                self._part_done(DoneReasoningPart(type="reasoning_text", text=text), common)
            )
            if self._summarized(item):
                self._summary_done(text, common, events)
        elif item.kind is _Kind.FUNCTION_CALL:
            events.append(
                ResponseFunctionCallArgumentsDoneEvent(
                    type="response.function_call_arguments.done",
                    arguments=_arguments(text),
                    sequence_number=self._seq(),
                    **common,
                )
            )
        else:
            events.append(
                ResponseCustomToolCallInputDoneEvent(
                    type="response.custom_tool_call_input.done",
                    input=text,
                    sequence_number=self._seq(),
                    **common,
                )
            )
        final = self._item_model(item, text, status, done=True)
        if item.kind in (_Kind.FUNCTION_CALL, _Kind.CUSTOM_TOOL_CALL):
            self._tool_calls += 1
        self._items.append(final)
        events.append(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                output_index=item.output_index,
                item=final,
                sequence_number=self._seq(),
            )
        )

    def _summary_done(
        self, text: str, common: dict[str, Any], events: list[ResponseStreamEvent]
    ) -> None:
        events.append(
            ResponseReasoningSummaryTextDoneEvent(
                type="response.reasoning_summary_text.done",
                summary_index=0,
                text=text,
                sequence_number=self._seq(),
                **common,
            )
        )
        events.append(
            ResponseReasoningSummaryPartDoneEvent(
                type="response.reasoning_summary_part.done",
                summary_index=0,
                part=DoneSummaryPart(type="summary_text", text=text),
                sequence_number=self._seq(),
                **common,
            )
        )

    def _summarized(self, item: _OpenItem) -> bool:
        return self._summarize and item.kind is _Kind.REASONING

    def _part_done(self, part: Any, common: dict[str, Any]) -> ResponseContentPartDoneEvent:
        return ResponseContentPartDoneEvent(
            type="response.content_part.done",
            content_index=0,
            part=part,
            sequence_number=self._seq(),
            **common,
        )

    def _delta_event(self, item: _OpenItem, delta: str) -> ResponseStreamEvent:
        common: dict[str, Any] = {
            "item_id": item.item_id,
            "output_index": item.output_index,
            "delta": delta,
            "sequence_number": self._seq(),
        }
        if item.kind is _Kind.MESSAGE:
            logprobs = [_delta_logprob(entry) for entry in item.pending]
            item.logprobs.extend(item.pending)
            item.pending = []
            return ResponseTextDeltaEvent(
                type="response.output_text.delta", content_index=0, logprobs=logprobs, **common
            )
        if item.kind is _Kind.REASONING:
            return ResponseReasoningTextDeltaEvent(
                type="response.reasoning_text.delta", content_index=0, **common
            )
        if item.kind is _Kind.FUNCTION_CALL:
            return ResponseFunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta", **common
            )
        return ResponseCustomToolCallInputDeltaEvent(
            type="response.custom_tool_call_input.delta", **common
        )

    def _item_model(
        self, item: _OpenItem, text: str, status: str, *, done: bool
    ) -> ResponseOutputItem:
        """A fresh item model (events keep their own copies: items are never mutated)."""
        if item.kind is _Kind.MESSAGE:
            return ResponseOutputMessage(
                id=item.item_id,
                type="message",
                role="assistant",
                status=status,
                content=[_output_text(text, item.sent_logprobs())] if done else [],
                phase=item.phase,
            )
        if item.kind is _Kind.REASONING:
            return self._reasoning_model(item, text, status, done=done)
        extra: dict[str, Any] = {"namespace": item.namespace} if item.namespace else {}
        if item.kind is _Kind.FUNCTION_CALL:
            return ResponseFunctionToolCall(
                id=item.item_id,
                type="function_call",
                call_id=item.call_id,
                name=item.name,
                arguments=_arguments(text) if done else "",
                status=status,
                **extra,
            )
        # The SDK's custom_tool_call has no `status`; Codex accepts it and it marks a call cut
        # short, so it is sent like the other items' (kept as an extra field).
        return ResponseCustomToolCall(
            id=item.item_id,
            type="custom_tool_call",
            call_id=item.call_id,
            name=item.name,
            input=text if done else "",
            status=status,
            **extra,
        )

    def _reasoning_model(
        self, item: _OpenItem, text: str, status: str, *, done: bool
    ) -> ResponseReasoningItem:
        if not done:
            return ResponseReasoningItem(id=item.item_id, type="reasoning", summary=[], content=[])
        summary = [ReasoningSummary(type="summary_text", text=text)] if self._summarize else []
        fields: dict[str, Any] = {
            "id": item.item_id,
            "type": "reasoning",
            "summary": summary,
            "content": [ReasoningContent(type="reasoning_text", text=text)],
        }
        sealed = self._sealed(text)
        if sealed is not None:
            # Only when sealed: the specification does not let `encrypted_content` be null.
            fields["encrypted_content"] = sealed
        if status == "incomplete":
            # Reasoning items carry no status when complete (as OpenAI sends them).
            fields["status"] = "incomplete"
        return ResponseReasoningItem(**fields)

    def _sealed(self, text: str) -> str | None:
        if self._seal is None:
            return None
        try:
            return self._seal(text)
        except Exception:
            logger.exception("response %s: reasoning not sealed", self._template.id)
            return None

    # --- small helpers -------------------------------------------------------------------

    def _seq(self) -> int:
        number = self._sequence
        self._sequence += 1
        return number

    def _require_parser(self) -> StreamableParser:
        if self._parser is None:
            raise RuntimeError("no harmony parser for the current message")
        return self._parser


def _output_text(text: str, logprobs: Sequence[TextLogprob] = ()) -> ResponseOutputText:
    return ResponseOutputText(
        type="output_text", text=text, annotations=[], logprobs=list(logprobs)
    )


def _arguments(text: str) -> str:
    # A call without arguments (`to=functions.list<|call|>`, or `<|message|>` straight to
    # `<|call|>`) is sent as "{}": clients parse arguments as JSON, and "" is not JSON.
    return text if text.strip() else "{}"


def _bare_name(recipient: str) -> str:
    """`functions.foo` / `ns.foo<|constrain|>json` -> `foo`, for recipients no tool matches."""
    cleaned = _RECIPIENT_TAIL.split(recipient.strip(), maxsplit=1)[0]
    return cleaned.rsplit(".", 1)[-1] or cleaned or recipient


def _response_error(code: str, message: str) -> ResponseError:
    try:
        return ResponseError(code=code, message=message)  # type: ignore[arg-type]
    except ValidationError:
        # The SDK's Literal lacks codes clients act on (`context_length_exceeded` and
        # `insufficient_quota` are fatal for Codex, others are retried): send the code as given.
        return ResponseError.model_construct(code=code, message=message)
