"""Which output item a harmony message becomes, and the message's text.

Each harmony message of a completion becomes one output item:

- ``analysis`` without a recipient: a ``reasoning`` item (``content: [reasoning_text]``; with
  ``summarize_reasoning``, also ``summary: [summary_text]`` holding the same text, since gpt-oss
  writes no summary and clients that show reasoning read only summaries);
- ``final`` (or no channel): a ``message`` with ``phase: "final_answer"``;
- ``commentary`` without a recipient: a ``message`` with ``phase: "commentary"`` (a preamble);
- any channel with a recipient: the item of the tool's kind when the server runs it (its kind
  has items registered, serve_app/protocol/tool_items.py: the tool loop runs it), a
  ``custom_tool_call`` when the recipient resolves to a custom tool; a ``shell_call``,
  ``local_shell_call`` or ``apply_patch_call`` when it resolves to that client-run tool
  (serve_app.harmony.client_tools); else a ``function_call`` when it resolves to a function
  (``ToolRegistry.resolve``: ``functions.NAME``, ``NAMESPACE.NAME`` or a bare ``NAME`` of one).

A recipient no tool of the request resolves to (gpt-oss invents some: ``repo_browser.search``,
a function the client never declared) becomes no item at all: OpenAI never returns a call of a
tool the request did not declare, and clients fail on one (the Agents SDKs end the run, "Tool
... not found"). The message is an `UnknownCall` instead, which the tool loop answers inside
the response with an error the model reads (serving/tools/unknown.py); it counts as a call
toward ``max_tool_calls``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from openai_harmony import Message, StreamableParser

from serve_app.harmony.recovery import ROLE_RECIPIENTS, recipient_name
from serve_app.harmony.tools import CLIENT_KINDS, ToolRegistry
from serve_app.protocol.stream_events import OpenItem, ResponseEventWriter
from serve_app.protocol.stream_items import CALL_CHANNEL
from serve_app.protocol.tool_items import tool_items

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnknownCall:
    """A call of a recipient no tool of the request resolves to: shown to no one (no item);
    the tool loop answers it as that recipient would, with an error the model reads."""

    # The recipient as the model wrote it (less what followed it in the header): the author
    # of the answer, as a tool's answer is authored by the tool the model called.
    recipient: str
    # The channel the model called it on: the answer goes back on it (as for any tool).
    channel: str
    # How many calls of tools the server runs the completion made before it (pending then):
    # its answer follows theirs, so the model reads the answers in the order it called.
    after_calls: int


def unknown_call(
    tools: ToolRegistry, channel: str | None, recipient: str | None, after_calls: int
) -> UnknownCall | None:
    """The message's call when its recipient is no tool of the request (None: it is not a
    call, or it calls a tool the request has)."""
    target = _call_target(recipient)
    if not target or tools.resolve(target) is not None:
        return None
    return UnknownCall(recipient_name(target), channel or "commentary", after_calls)


class UnknownCalls:
    """A completion's calls of tools the request does not have (`UnknownCall`): none opens an
    item; each the model ends is kept, and counted as a call, for the tool loop to answer."""

    def __init__(self) -> None:
        self._open: UnknownCall | None = None
        self._made: list[UnknownCall] = []

    def hides(
        self,
        writer: ResponseEventWriter,
        tools: ToolRegistry,
        channel: str | None,
        recipient: str | None,
        refused: bool,
    ) -> bool:
        """Whether the message opening now opens no item: a call ``refused`` (past
        ``max_tool_calls``: dropped, never answered), or a call of a tool the request does not
        have (kept once the model ends it: `end`). Asked of every message, so what it keeps
        is always the open message's."""
        after_calls = len(writer.pending_calls)
        self._open = None if refused else unknown_call(tools, channel, recipient, after_calls)
        return refused or self._open is not None

    def end(self, writer: ResponseEventWriter, *, made: bool) -> None:
        """The open message ended: its call is kept when the model ``made`` it (ended it
        itself, not cut short), counted toward ``max_tool_calls`` as any call."""
        if self._open is not None and made:
            self._made.append(self._open)
            writer.count_unshown_call()
        self._open = None

    @property
    def calls(self) -> list[UnknownCall]:
        """The calls kept, in the model's order, not answered yet."""
        return list(self._made)

    def take(self) -> list[UnknownCall]:
        """The calls kept, now the caller's to answer."""
        calls, self._made = self._made, []
        return calls

    def clear(self) -> None:
        """A new completion: the last one's calls were answered, or never will be."""
        self._open = None
        self._made = []


def open_item(
    writer: ResponseEventWriter, tools: ToolRegistry, channel: str | None, recipient: str | None
) -> OpenItem | None:
    """Open (announce) the item a message's header names; None (nothing opened) for a call of
    a tool the request does not have (`unknown_call`)."""
    target = _call_target(recipient)
    if target:
        spec = tools.resolve(target)
        if spec is None:
            return None
        if tool_items(spec.kind) is not None:
            item = writer.open_tool_call(spec.kind, spec.name, spec.item_namespace)
            item.data[CALL_CHANNEL] = channel  # its output is the tool's message on it
            return item
        if spec.kind == "custom":
            return writer.open_custom_tool_call(spec.name, spec.item_namespace)
        if spec.kind in CLIENT_KINDS:
            return writer.open_client_call(spec.kind)
        return writer.open_function_call(spec.name, spec.item_namespace)
    if channel == "analysis":
        return writer.open_reasoning()
    return writer.open_message("commentary" if channel == "commentary" else "final_answer")


def opens_call(recipient: str | None) -> bool:
    """Whether a message with this recipient is a tool call (of any kind)."""
    return bool(_call_target(recipient))


def _call_target(recipient: str | None) -> str:
    target = (recipient or "").strip()
    if target.startswith("<|"):
        # `<|channel|>final <|constrain|>json<|message|>`: harmony's parser reports the
        # content type as the recipient. A recipient is a name (`to=NAME`), never a token.
        return ""
    return "" if target in ROLE_RECIPIENTS else target


class CallLimit:
    """``max_tool_calls`` over a response's completions: the completion in which the last call
    allowed was made is cut after it (its engine request stopped), and in a later completion
    (the tool loop's, after the server ran calls) the first call beyond it is refused: not
    opened, the rest of that completion dropped (OpenAI: "any further attempts to call a tool
    by the model will be ignored")."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._calls_at_start = 0
        self.refused = False

    def begin(self, calls: int) -> None:
        """A completion starts, ``calls`` calls made before it."""
        self._calls_at_start = calls
        self.refused = False

    def reached(self, calls: int) -> bool:
        return self.limit is not None and calls >= self.limit

    def refuses(self, calls: int, recipient: str | None) -> bool:
        """Whether a message to ``recipient`` is a call beyond the limit (then refused)."""
        if self.reached(calls) and opens_call(recipient):
            self.refused = True
        return self.refused

    def exhausted(self, calls: int) -> bool:
        """Whether the rest of this completion is dropped."""
        return self.refused or (self.reached(calls) and calls > self._calls_at_start)


def message_text(message: Message) -> str:
    return "".join(getattr(part, "text", "") or "" for part in message.content)


class MessageText:
    """The open message's text not yet sent as a delta: what harmony decoded of each token as
    it came (nothing while a UTF-8 character is split across tokens, then the whole
    character), after the text salvaged from its header (``prefix``). Joined, these pieces are
    the parser's ``current_content``, which decodes the whole message again on each read."""

    __slots__ = ("_unsent", "prefix")

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._unsent = [prefix] if prefix else []

    def add(self, parser: StreamableParser) -> None:
        """What the token the parser just processed added."""
        delta = parser.last_content_delta
        if delta:
            self._unsent.append(delta)

    def take(self) -> str:
        """The text added since the last take (empty: none)."""
        unsent = self._unsent
        if len(unsent) <= 1:
            return unsent.pop() if unsent else ""
        delta = "".join(unsent)
        unsent.clear()
        return delta


def final_text(parser: StreamableParser, stop_token: int | None, response_id: str) -> str | None:
    """The message's whole text once ``parser`` reads its stop token (``None``: the end of
    generation); None when harmony cannot finalise it."""
    try:
        if stop_token is None:
            parser.process_eos()
        else:
            parser.process(stop_token)
        messages = parser.messages
    except Exception as exc:
        logger.info("response %s: message not finalised (%s)", response_id, exc)
        return None
    return message_text(messages[-1]) if messages else None


def current_text(parser: StreamableParser | None) -> str | None:
    """What ``parser`` has decoded of the open message so far (None: nothing to read)."""
    if parser is None:
        return None
    try:
        return parser.current_content
    except Exception:
        return None
