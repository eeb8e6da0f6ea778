"""``response.inject``: the client's tool outputs put into a response running on this
WebSocket connection, which goes on in place with them (the openai SDK's beta types,
``openai.types.beta.beta_response_inject_*``: "Injects input items into an active response
over a WebSocket connection. The items are validated and committed atomically. Currently, the
server accepts client-owned tool outputs that resume a waiting agent.").

- It is a beta: only on a connection opened with ``OpenAI-Beta: responses_multi_agent=v1``
  (the SDK's ``betas`` value; its WebSocket client sends headers given to ``connect``). Without
  it, ``response.inject`` is an ``error`` event (400) naming the header to send.
- With it, a response whose model calls tools the client runs (function, custom, shell,
  local_shell, apply_patch) waits after that completion for their outputs, at most
  ``Limits.websocket_inject_wait_s``, instead of ending (serve_app/serving/turn/client_outputs.py);
  then ends with the calls, as without the beta. A ``response.create`` continuing a waiting
  response ends its wait at once: the client chose to answer the old way.
- An inject's input: a non-empty list of the outputs of those calls (``function_call_output``,
  ``custom_tool_call_output``, ``shell_call_output``, ``local_shell_call_output``,
  ``apply_patch_call_output``), each naming by ``call_id`` a call of that response, of the
  matching type, with no output yet, at most one output per call. All or nothing: one item
  that does not hold commits none. A malformed one is a 400 ``error`` event naming it
  (``input[i]...``) at once; one naming a call the response does not owe is the same 400 when
  the response waits (the inject is decided then, in arrival order, on the response's own
  task: an inject sent as the call's ``output_item.done`` arrives, before the completion has
  formally ended, is not refused for it).
- Committed: ``response.inject.created`` (numbered in the response's stream, on its lane),
  then the outputs as the response's items (``output_item.added`` and ``.done``); once every
  owed call has its output, the model's next completion continues the same response on the
  same engine session (its prefix cached). The response is stored once, at its end, with the
  outputs and the continuation in its ``output``.
- Not committed: ``response.inject.failed`` giving the input back, with ``response_not_found``
  (no response of that id on this connection: another connection's, or one made over HTTP) or
  ``response_already_completed`` (it ended before the inject was decided; continue it with a
  ``response.create`` instead).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from openai.types.responses import ResponseOutputItem
from openai.types.responses.responses_server_event import ResponseWsError, ResponseWsErrorError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from serve_app.protocol.body_errors import from_validation_errors
from serve_app.protocol.client_outputs import INJECTABLE_TYPES, OUTPUT_OF_CALL, output_item
from serve_app.protocol.errors import APIError, InvalidRequest
from serve_app.protocol.request_base import STRICT_TYPES
from serve_app.protocol.requests import InputItem, ToolOutputItem
from serve_app.serving.admission.responses import check_text
from serve_app.serving.admission.websocket import LaneRefused
from serve_app.serving.lanes import Outbox, PendingInput, with_stream_id
from serve_app.serving.steering import Record, SteerDesk
from serve_app.serving.turn.client_outputs import ClientOutputs, Committed

logger = logging.getLogger(__name__)

INJECT = "response.inject"
BETA = "responses_multi_agent=v1"
FailedCode = Literal["response_already_completed", "response_not_found"]

_INPUT_ITEM: TypeAdapter[InputItem] = TypeAdapter(InputItem)


def beta_enabled(header: str | None) -> bool:
    """Whether an ``OpenAI-Beta`` header (comma-separated betas) turns the beta on."""
    return header is not None and BETA in {part.strip() for part in header.split(",")}


def missing_beta() -> InvalidRequest:
    """The error for ``response.inject`` on a connection without the beta (OpenAI's words for
    a beta API called without its header)."""
    return InvalidRequest(
        "You must provide the 'OpenAI-Beta' header to use response.inject. Please try again "
        f"by setting the header 'OpenAI-Beta: {BETA}' on the WebSocket connection."
    )


class _InjectEvent(BaseModel):
    """``response.inject``: only ``type``, ``response_id`` and ``input`` (the SDK's event)."""

    model_config = ConfigDict(**STRICT_TYPES, extra="forbid")
    type: Literal["response.inject"]
    response_id: str = Field(min_length=1)
    input: list[dict[str, Any]] = Field(min_length=1)


@dataclass(frozen=True)
class Offer:
    """A valid inject, waiting for its response to decide it."""

    response_id: str
    sent: list[dict[str, Any]]  # as the client sent it: what a failure gives back
    inputs: list[ToolOutputItem]
    items: list[ResponseOutputItem]
    size: int


class InjectDesk:
    """A connection's ``response.inject`` messages: read as they arrive (on the reader, like a
    steer), offered to the response they name, answered when it decides them."""

    def __init__(
        self,
        steering: SteerDesk,
        outbox: Outbox,
        pending: PendingInput,
        *,
        beta: bool,
        wait_s: float,
    ) -> None:
        self._steering = steering
        self._outbox = outbox
        self._pending = pending
        self.beta = beta
        self._wait_s = wait_s

    def open(self, record: Record) -> None:
        """``record``'s response is about to stream: with the beta, it waits for the client's
        outputs (its box of offers)."""
        if self.beta and record.turn is not None:
            record.turn.client_outputs = ClientOutputs(self._wait_s, _Judge(self, record))

    @staticmethod
    def end(record: Record) -> None:
        """``record``'s response ended (its terminal event sent): offers it never decided are
        refused."""
        turn = record.turn
        if turn is not None and turn.client_outputs is not None:
            turn.client_outputs.close()

    def release(self, response_id: Any) -> None:
        """A ``response.create`` continues ``response_id``: if it waits, it waits no more."""
        record = self._steering.record(response_id) if isinstance(response_id, str) else None
        if record is not None and record.turn is not None and record.turn.client_outputs:
            record.turn.client_outputs.release()

    def inject(self, message: dict[str, Any], size: int) -> None:
        """Read one ``response.inject``: refused at once, or offered to its response."""
        response_id = message.get("response_id")
        response_id = response_id if isinstance(response_id, str) else ""
        record = self._steering.record(response_id)
        stream_id = record.stream_id if record is not None else None
        if not self.beta:
            self.send_error(missing_beta(), stream_id)
            return
        try:
            offer = _offer(message, size)
        except APIError as error:
            self.send_error(error, stream_id)
            return
        if record is None:
            message_text = f"No response with id '{response_id}' on this connection."
            self.send_failed(offer, "response_not_found", message_text, None)
            return
        turn = record.turn
        if turn is None or turn.client_outputs is None:
            self.send_failed(offer, "response_already_completed", _ended(record), record)
            return
        if (overflow := self._pending.fits(size, request=False)) is not None:
            refused = LaneRefused(
                f"Too much input pending on this connection ({overflow}).",
                code="rate_limit_exceeded",
            )
            self.send_error(refused, stream_id)
            return
        self._pending.take(size, request=False)
        turn.client_outputs.offer(offer)

    # --- answers -------------------------------------------------------------------------

    def created(self, offer: Offer, record: Record) -> None:
        self._pending.give_back(offer.size, request=False)
        logger.info("websocket: inject committed into response %s", offer.response_id)
        event = {
            "type": "response.inject.created",
            "response_id": offer.response_id,
            "sequence_number": record.take_sequence(),
        }
        self._push(event, record.stream_id)

    def ended(self, offer: Offer, record: Record) -> None:
        """Queued, and the response ended before deciding it."""
        self._pending.give_back(offer.size, request=False)
        self.send_failed(offer, "response_already_completed", _ended(record), record)

    def refused(self, offer: Offer, error: APIError, record: Record) -> None:
        """Decided and not committed: a 400 naming the item."""
        self._pending.give_back(offer.size, request=False)
        self.send_error(error, record.stream_id)

    def send_failed(
        self, offer: Offer, code: FailedCode, message: str, record: Record | None
    ) -> None:
        """``response.inject.failed``, the input given back as sent."""
        logger.info("websocket: inject for %r failed: %s", offer.response_id, code)
        event = {
            "type": "response.inject.failed",
            "response_id": offer.response_id,
            "input": offer.sent,
            "error": {"code": code, "message": message},
            "sequence_number": record.take_sequence() if record is not None else 0,
        }
        self._push(event, record.stream_id if record is not None else None)

    def send_error(self, error: APIError, stream_id: str | None) -> None:
        logger.info("websocket: inject rejected: %s (param %s)", error.message, error.param)
        event = ResponseWsError(
            type="error",
            status=error.status_code,
            error=ResponseWsErrorError(
                type=error.error_type, code=error.code, message=error.message, param=error.param
            ),
        )
        self._push_text(event.model_dump_json(exclude_unset=True), stream_id)

    def _push(self, event: dict[str, Any], stream_id: str | None) -> None:
        self._push_text(json.dumps(event, ensure_ascii=False, separators=(",", ":")), stream_id)

    def _push_text(self, text: str, stream_id: str | None) -> None:
        try:
            self._outbox.push([with_stream_id(text, stream_id)])
        except Exception:  # the socket is gone: nobody to tell
            logger.info("websocket: an inject event not sent, the connection is closed")


@dataclass
class _Judge:
    """Decides one response's offers (`serve_app.serving.turn.client_outputs.Judge`)."""

    desk: InjectDesk
    record: Record

    def decide(self, offer: Offer, owed: Mapping[str, str]) -> Committed | None:
        for index, item in enumerate(offer.inputs):
            call_type = owed.get(item.call_id)
            if call_type is None:
                error = InvalidRequest(
                    f"Response '{offer.response_id}' awaits no output for call_id "
                    f"'{item.call_id}': it made no such call, or the call has its output.",
                    param=f"input[{index}].call_id",
                )
                self.desk.refused(offer, error, self.record)
                return None
            if OUTPUT_OF_CALL[call_type] != item.type:
                error = InvalidRequest(
                    f"Call '{item.call_id}' is a {call_type}: its output is a "
                    f"{OUTPUT_OF_CALL[call_type]}, not a {item.type}.",
                    param=f"input[{index}].type",
                )
                self.desk.refused(offer, error, self.record)
                return None
        self.desk.created(offer, self.record)
        return Committed(offer.inputs, offer.items)

    def refuse_ended(self, offer: Offer) -> None:
        self.desk.ended(offer, self.record)


def _offer(message: dict[str, Any], size: int) -> Offer:
    """A valid inject's offer; its 400 (naming the field or item) otherwise."""
    try:
        event = _InjectEvent.model_validate(message)
    except ValidationError as exc:
        raise from_validation_errors(list(exc.errors())) from exc
    inputs: list[ToolOutputItem] = []
    items: list[ResponseOutputItem] = []
    seen: set[str] = set()
    for index, sent in enumerate(event.input):
        if sent.get("type") not in INJECTABLE_TYPES:
            raise InvalidRequest(
                f"Only the outputs of tools the client runs can be injected "
                f"({', '.join(INJECTABLE_TYPES)}), not {sent.get('type')!r}.",
                param=f"input[{index}].type",
            )
        try:
            item = _INPUT_ITEM.validate_python(sent)
            placed = output_item(sent)
        except ValidationError as exc:
            errors = [
                {**error, "loc": ("input", index, *error["loc"][1:])} for error in exc.errors()
            ]
            raise from_validation_errors(errors) from exc
        if not isinstance(item, ToolOutputItem):  # INJECTABLE_TYPES are all tool outputs
            raise InvalidRequest("Not a tool output.", param=f"input[{index}].type")
        # Held to the piece limit a request's input is: it is rendered on the event loop.
        check_text(item, f"input[{index}]")
        if item.call_id in seen:
            raise InvalidRequest(
                f"Two outputs for call_id '{item.call_id}'.", param=f"input[{index}].call_id"
            )
        seen.add(item.call_id)
        inputs.append(item)
        items.append(placed)
    return Offer(event.response_id, event.input, inputs, items, size)


def _ended(record: Record) -> str:
    return (
        f"Response '{record.response_id}' already ended: send the input in a response.create "
        "continuing it instead."
    )
