"""Steering (``response.steer``): user input queued for a response running on the connection.

What the server does, in the SDK's words (``openai.types.responses.response_steer_*``):

- ``response.steer.accepted`` once the input is valid and held for a running response of this
  connection (the server owns it; its ``steer.id`` names it from then on).
- The running response ends at its next **safe boundary**: when the harmony message being
  written closes (``<|end|>``), or at once when none is open, never after a tool call whose
  output the client owes. It ends ``incomplete`` with ``incomplete_details.reason: "steered"``,
  its engine request aborted; the items it finished are kept. A response that ends on its own
  before reaching one keeps its status.
- Then an automatic successor: the same request's settings, ``previous_response_id`` the
  steered (or completed, or cut by ``max_output_tokens``) response, the accepted inputs as its
  input in submission order; its ``response.created`` is the commit point. It runs on the same
  lane before the lane's next queued request, and can be steered in turn.
- A response that stops for tool output (it ends with function or custom tool calls) keeps the
  input: ``response.steer.pending`` (``waiting_for_required_input``, one stub per call in
  ``required_input``) after ``response.completed``; the next ``response.create`` on the same lane
  continuing that response gets the inputs prepended to its input, with its own settings.
- What cannot be committed comes back in ``response.steer.failed`` with its input: codes
  ``invalid_input`` (not the event's three fields; not a non-empty string or list of user
  messages of text, image or file parts), ``response_not_found`` (no response of that id on this
  connection), ``steering_not_supported`` (bound to a ``conversation``, or using
  ``context_management`` compaction), ``too_many_pending_steers``
  (``max_websocket_steers_per_response``, or the connection's pending bytes),
  ``response_already_completed`` (it ended: completed or incomplete), ``response_not_active``
  (it failed), ``successor_creation_failed`` (the successor, or the explicit continuation that
  should carry pending input, was refused: the error's message says why).

Steering events are numbered in the target response's stream (its next ``sequence_number``)
and carry its lane's ``stream_id``; a refusal naming no response of the connection has 0.
Input held when the connection closes is dropped with it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseSteerAcceptedEvent,
    ResponseSteerPendingEvent,
)
from openai.types.responses.response_steer_required_input import (
    ApplyPatchCallOutput,
    CustomToolCallOutput,
    FunctionCallOutput,
    ResponseSteerRequiredInput,
    ShellCallOutput,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serve_app.config import Limits
from serve_app.protocol.body_errors import from_validation_errors
from serve_app.protocol.request_base import STRICT_TYPES
from serve_app.protocol.requests import ContentPart, InputItem, MessageItem, ResponsesRequest
from serve_app.serving.lanes import Outbox, PendingInput, with_stream_id
from serve_app.serving.turn.state import Turn

logger = logging.getLogger(__name__)

STEER = "response.steer"
FAILED = "response.steer.failed"
ErrorCode = Literal[
    "response_not_found",
    "invalid_input",
    "steering_not_supported",
    "too_many_pending_steers",
    "response_already_completed",
    "response_not_active",
    "successor_creation_failed",
]
STEER_PART_TYPES = ("input_text", "input_image", "input_file")


class _SteerPart(ContentPart):
    model_config = ConfigDict(**STRICT_TYPES, extra="allow")
    type: Literal["input_text", "input_image", "input_file"]


class _SteerMessage(BaseModel):
    """A steering message: only ``type`` (``message``), ``role`` (``user``) and ``content``."""

    model_config = ConfigDict(**STRICT_TYPES, extra="forbid")
    type: Literal["message"] = "message"
    role: Literal["user"]
    content: str | list[_SteerPart] = Field(min_length=1)


class _SteerEvent(BaseModel):
    """``response.steer``: only ``type``, ``previous_response_id`` and ``input``."""

    model_config = ConfigDict(**STRICT_TYPES, extra="forbid")
    type: Literal["response.steer"]
    previous_response_id: str = Field(min_length=1)
    input: str | list[_SteerMessage] = Field(min_length=1)

    def items(self) -> list[InputItem]:
        """The input as the items a successor's request carries: user messages."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return [
            MessageItem.model_validate(message.model_dump(mode="json", exclude_none=True))
            for message in self.input
        ]


@dataclass
class Steer:
    """Accepted steering input, held until a successor commits it or it fails."""

    id: str
    previous_response_id: str
    input: Any  # as the client sent it: what `response.steer.failed` gives back
    items: list[InputItem]
    size: int


@dataclass
class Record:
    """A response this connection made: its lane, and while it runs, its turn."""

    response_id: str
    stream_id: str | None
    # Why it cannot be steered (`steering_not_supported`), or None.
    unsteerable: str | None = None
    turn: Turn | None = None
    status: str | None = None  # once ended
    steers: list[Steer] = field(default_factory=list)
    # The next sequence number of its stream once it ended (the translator's until then).
    next_sequence: int = 0

    def take_sequence(self) -> int:
        if self.turn is not None:
            return self.turn.translator.take_sequence()
        number = self.next_sequence
        self.next_sequence += 1
        return number


@dataclass
class Successor:
    """What a lane runs next after a response: a request, and the steers it commits."""

    request: ResponsesRequest
    steers: list[Steer]


class SteerDesk:
    """A connection's responses (as steering needs them) and the steering input it holds."""

    def __init__(self, outbox: Outbox, limits: Limits, pending: PendingInput) -> None:
        self._outbox = outbox
        self._pending = pending
        self._max_steers = limits.max_websocket_steers_per_response
        self._capacity = limits.max_connection_responses
        self._records: OrderedDict[str, Record] = OrderedDict()
        # Steers kept for a response that stopped for tool output, with the lane whose next
        # continuation of it takes them.
        self._waiting: dict[str, tuple[str | None, list[Steer]]] = {}

    # --- the responses -------------------------------------------------------------------

    def record(self, response_id: str) -> Record | None:
        """This connection's response ``response_id`` (running, or one of the last ended)."""
        return self._records.get(response_id)

    def lane_of(self, response_id: str | None) -> str | Literal[False] | None:
        """The lane that made ``response_id``; False when this connection did not."""
        record = self._records.get(response_id or "")
        return record.stream_id if record is not None else False

    def start(self, turn: Turn, stream_id: str | None, unsteerable: str | None) -> Record:
        """``turn`` is about to stream on ``stream_id``: steerable from now until it ends."""
        record = Record(turn.response.id, stream_id, unsteerable, turn)
        self._add(record)
        turn.end_at_boundary = lambda: bool(record.steers)
        return record

    def ended_at_once(self, response: Response, stream_id: str | None, sequences: int) -> None:
        """A response answered whole without streaming (a prewarm): known, never steerable."""
        record = Record(response.id, stream_id, status=response.status, next_sequence=sequences)
        self._add(record)

    def _add(self, record: Record) -> None:
        self._records[record.response_id] = record
        # Newest kept; a running response is never dropped (at most one per lane).
        for response_id in list(self._records):
            if len(self._records) <= self._capacity:
                break
            if self._records[response_id].turn is None:
                del self._records[response_id]

    def end(self, record: Record) -> Successor | None:
        """After ``record``'s terminal event was sent: what becomes of its steers. Pending or
        failed events sent here; the successor to run returned."""
        turn = record.turn
        if turn is None:
            return None
        response = turn.response
        record.status = response.status
        record.next_sequence = turn.translator.take_sequence()
        record.turn = None
        steers, record.steers = record.steers, []
        if not steers:
            return None
        if response.status in ("failed", "cancelled"):
            reason = response.error.message if response.error else response.status
            for steer in steers:
                self._failed(
                    steer,
                    "response_not_active",
                    f"The response ended {response.status} "
                    f"before its steering input was committed: {reason}",
                    record,
                )
            return None
        calls = _required_input(response)
        if calls:
            self._waiting.setdefault(response.id, (record.stream_id, []))[1].extend(steers)
            for steer in steers:
                self._send(
                    ResponseSteerPendingEvent(
                        type="response.steer.pending",
                        reason="waiting_for_required_input",
                        required_input=calls,
                        sequence_number=record.take_sequence(),
                        steer={"id": steer.id, "previous_response_id": response.id},
                    ),
                    record.stream_id,
                )
            return None
        items = [item for steer in steers for item in steer.items]
        request = turn.request.model_copy(
            update={"input": items, "previous_response_id": response.id, "conversation": None}
        )
        logger.info(
            "websocket: response %s steered (%s): %d input(s) for its successor",
            response.id,
            response.status,
            len(steers),
        )
        return Successor(request, steers)

    def take_waiting(
        self, request: ResponsesRequest, stream_id: str | None
    ) -> tuple[ResponsesRequest, list[Steer]]:
        """An explicit continuation on the lane of a response that kept steering input: the
        request with that input prepended, and the steers it commits."""
        parent = request.previous_response_id
        held = self._waiting.get(parent or "")
        if held is None or held[0] != stream_id:
            return request, []
        del self._waiting[parent or ""]
        steers = held[1]
        items = [item for steer in steers for item in steer.items]
        return request.model_copy(update={"input": [*items, *request.input_items]}), steers

    def commit(self, steers: list[Steer]) -> None:
        """A successor carrying ``steers`` was created: the input is no longer ours to hold."""
        for steer in steers:
            self._pending.give_back(steer.size, request=False)

    def fail(self, steers: list[Steer], message: str) -> None:
        """The successor meant to carry ``steers`` was refused."""
        for steer in steers:
            record = self._records.get(steer.previous_response_id)
            self._failed(steer, "successor_creation_failed", message, record)

    # --- response.steer ----------------------------------------------------------------------

    def steer(self, message: dict[str, Any], size: int) -> None:
        """Accept or refuse one ``response.steer`` (its events pushed before any later one)."""
        target_id = message.get("previous_response_id")
        target_id = target_id if isinstance(target_id, str) else ""
        raw_input = message.get("input", "")
        record = self._records.get(target_id)
        try:
            event = _SteerEvent.model_validate(message)
        except ValidationError as exc:
            error = from_validation_errors(list(exc.errors()))
            self._refuse(target_id, raw_input, "invalid_input", error.message, record)
            return
        if record is None:
            self._refuse(
                target_id,
                raw_input,
                "response_not_found",
                f"No response with id '{target_id}' on this connection.",
                None,
            )
            return
        if record.unsteerable is not None:
            self._refuse(target_id, raw_input, "steering_not_supported", record.unsteerable, record)
            return
        turn = record.turn
        if turn is None or turn.translator.ended:
            status = record.status if turn is None else turn.response.status
            code: ErrorCode = (
                "response_not_active"
                if status in ("failed", "cancelled")
                else "response_already_completed"
            )
            self._refuse(
                target_id,
                raw_input,
                code,
                f"Response '{target_id}' already ended ({status}): send the input in a "
                "response.create instead.",
                record,
            )
            return
        overflow = self._pending.fits(size, request=False)
        if len(record.steers) >= self._max_steers or overflow is not None:
            self._refuse(
                target_id,
                raw_input,
                "too_many_pending_steers",
                f"Response '{target_id}' holds too much steering input "
                f"({overflow or f'at most {self._max_steers} steers'}).",
                record,
            )
            return
        steer = Steer(f"steer_{uuid.uuid4().hex}", target_id, raw_input, event.items(), size)
        self._pending.take(size, request=False)
        record.steers.append(steer)
        self._send(
            ResponseSteerAcceptedEvent(
                type="response.steer.accepted",
                sequence_number=record.take_sequence(),
                steer={"id": steer.id, "previous_response_id": target_id},
            ),
            record.stream_id,
        )
        logger.info("websocket: %s accepted for response %s", steer.id, target_id)

    def _refuse(
        self, target_id: str, raw_input: Any, code: ErrorCode, message: str, record: Record | None
    ) -> None:
        """Refused before acceptance: no steer id."""
        logger.info("websocket: steer for %r refused: %s (%s)", target_id, code, message)
        self._send_failed(
            {"previous_response_id": target_id, "input": raw_input}, code, message, record
        )

    def _failed(self, steer: Steer, code: ErrorCode, message: str, record: Record | None) -> None:
        """Accepted, then not committed: the input given back under its steer id."""
        self._pending.give_back(steer.size, request=False)
        logger.info("websocket: %s failed: %s (%s)", steer.id, code, message)
        self._send_failed(
            {
                "id": steer.id,
                "previous_response_id": steer.previous_response_id,
                "input": steer.input,
            },
            code,
            message,
            record,
        )

    def _send_failed(
        self, steer: dict[str, Any], code: ErrorCode, message: str, record: Record | None
    ) -> None:
        # As a dict: the input goes back as the client sent it, valid or not.
        event: dict[str, Any] = {
            "type": FAILED,
            "sequence_number": record.take_sequence() if record is not None else 0,
            "steer": steer,
            "error": {"code": code, "message": message, "type": "invalid_request_error"},
        }
        self._push(json.dumps(event, ensure_ascii=False, separators=(",", ":")), record)

    def _send(self, event: BaseModel, stream_id: str | None) -> None:
        self._push_text(event.model_dump_json(exclude_none=True), stream_id)

    def _push(self, text: str, record: Record | None) -> None:
        self._push_text(text, record.stream_id if record is not None else None)

    def _push_text(self, text: str, stream_id: str | None) -> None:
        try:
            self._outbox.push([with_stream_id(text, stream_id)])
        except Exception:  # the socket is gone: nobody to tell
            logger.info("websocket: a steering event not sent, the connection is closed")


def _required_input(response: Response) -> list[ResponseSteerRequiredInput]:
    """Stubs of the tool outputs a completed response waits for (none: it waits for none)."""
    if response.status != "completed":
        return []
    stubs: list[ResponseSteerRequiredInput] = []
    for item in response.output:
        if item.type == "function_call":
            stubs.append(
                FunctionCallOutput(
                    type="function_call_output", call_id=item.call_id, name=item.name
                )
            )
        elif item.type == "custom_tool_call":
            stubs.append(CustomToolCallOutput(type="custom_tool_call_output", call_id=item.call_id))
        elif item.type == "shell_call":
            stubs.append(ShellCallOutput(type="shell_call_output", call_id=item.call_id))
        elif item.type == "apply_patch_call":
            stubs.append(ApplyPatchCallOutput(type="apply_patch_call_output", call_id=item.call_id))
    return stubs


def unsteerable_reason(request: ResponsesRequest) -> str | None:
    """Why a response made from this request cannot be steered (None: it can)."""
    if request.conversation_id is not None:
        return "A response bound to a conversation cannot be steered."
    if any(entry.type == "compaction" for entry in request.context_management or []):
        return "A response using context_management compaction cannot be steered."
    return None
