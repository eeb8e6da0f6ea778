"""The items and events of the calls the model makes to client-run tools: ``shell_call``,
``local_shell_call`` and ``apply_patch_call``, built as the openai SDK types them
(``response_function_shell_tool_call.py``, ``response_output_item.py``'s ``LocalShellCall``,
``response_apply_patch_tool_call.py``, ``response_shell_call_command_*_event.py``). No
harmony, no Ray.

The model writes such a call as JSON arguments to a function (serve_app.harmony.client_tools);
the item carries those arguments as its ``action`` (``operation``), which no item can hold half
written. So the writer (stream_events.py) keeps the arguments as they stream and announces the
item when the call ends: ``output_item.added`` (``in_progress``, with its action), for a shell
call each command's ``response.shell_call_command.added``, ``.delta`` and ``.done``, then
``output_item.done``. Arguments that do not parse (a call cut short by ``max_output_tokens``;
constrained decoding enforces the schema otherwise) make no such item: the writer sends the
call as a ``function_call`` of that name, as it sends a call to a tool it does not know.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from openai.types.responses import (
    ResponseApplyPatchToolCall,
    ResponseFunctionShellToolCall,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseShellCallCommandAddedEvent,
    ResponseShellCallCommandDeltaEvent,
    ResponseShellCallCommandDoneEvent,
    ResponseStreamEvent,
)
from openai.types.responses.response_local_environment import ResponseLocalEnvironment
from openai.types.responses.response_output_item import LocalShellCall, LocalShellCallAction
from pydantic import ValidationError

from serve_app.protocol import responses as builders
from serve_app.protocol.stream_items import ItemKind, ItemStatus, OpenItem, delta_event

# The writer's item kind of each client-run tool's call (the tool's type is the function name).
CLIENT_CALL_KINDS = {
    "shell": ItemKind.SHELL_CALL,
    "local_shell": ItemKind.LOCAL_SHELL_CALL,
    "apply_patch": ItemKind.APPLY_PATCH_CALL,
}
DEFERRED_KINDS = frozenset(CLIENT_CALL_KINDS.values())


def new_item_id(kind: ItemKind) -> str:
    return builders.new_item_id(builders.ITEM_ID_PREFIXES[kind.value])


def call_item(item: OpenItem, status: str) -> ResponseOutputItem | None:
    """The finished call ``item`` (its arguments, ``item.text``, as its action) with
    ``status``, or None when the arguments are not the tool's."""
    try:
        arguments = json.loads(item.text)
        if not isinstance(arguments, dict):
            return None
        return _build(item, arguments, status)
    except (ValueError, TypeError, KeyError, ValidationError):
        return None


def _build(item: OpenItem, arguments: dict[str, Any], status: str) -> ResponseOutputItem | None:
    common: dict[str, Any] = {"id": item.item_id, "call_id": item.call_id, "status": status}
    if item.kind is ItemKind.SHELL_CALL:
        action = {key: arguments.get(key) for key in ("timeout_ms", "max_output_length")}
        return ResponseFunctionShellToolCall(
            type="shell_call",
            action={"commands": arguments["commands"], **action},
            environment=ResponseLocalEnvironment(type="local"),
            **common,
        )
    if item.kind is ItemKind.LOCAL_SHELL_CALL:
        action = LocalShellCallAction(
            type="exec",
            command=arguments["command"],
            env=arguments.get("env") or {},
            timeout_ms=arguments.get("timeout_ms"),
            user=arguments.get("user"),
            working_directory=arguments.get("working_directory"),
        )
        return LocalShellCall(type="local_shell_call", action=action, **common)
    if status not in ("in_progress", "completed"):
        return None  # an apply_patch_call cannot be incomplete
    operation = {"type": arguments["type"], "path": arguments["path"]}
    if arguments["type"] != "delete_file":
        operation["diff"] = arguments["diff"]
    return ResponseApplyPatchToolCall(type="apply_patch_call", operation=operation, **common)


def in_progress(done: ResponseOutputItem) -> ResponseOutputItem:
    """The item as ``output_item.added`` announces it: the same, ``in_progress``."""
    return done.model_copy(update={"status": "in_progress"})


def command_events(
    item: ResponseOutputItem, output_index: int, next_sequence: Any
) -> list[ResponseStreamEvent]:
    """A shell call's ``response.shell_call_command.added``, ``.delta`` (the whole command)
    and ``.done`` for each of its commands (none for other items). ``next_sequence()``: the
    stream's next sequence number."""
    if not isinstance(item, ResponseFunctionShellToolCall):
        return []
    events: list[ResponseStreamEvent] = []
    for index, command in enumerate(item.action.commands):
        common: dict[str, Any] = {"output_index": output_index, "command_index": index}
        events += (
            ResponseShellCallCommandAddedEvent(
                type="response.shell_call_command.added",
                command="",
                sequence_number=next_sequence(),
                **common,
            ),
            ResponseShellCallCommandDeltaEvent(
                type="response.shell_call_command.delta",
                delta=command,
                sequence_number=next_sequence(),
                **common,
            ),
            ResponseShellCallCommandDoneEvent(
                type="response.shell_call_command.done",
                command=command,
                sequence_number=next_sequence(),
                **common,
            ),
        )
    return events


class ClientCallWriting:
    """`ResponseEventWriter`'s part (stream_events.py) for calls to client-run tools: opened
    silently, announced and done at once at `close`."""

    if TYPE_CHECKING:  # the writer's own state and helpers
        _events: list[ResponseStreamEvent]
        _tool_calls: int

        def _seq(self) -> int: ...
        def _output_index(self) -> int: ...
        def _open(self, item: OpenItem) -> OpenItem: ...
        def _item_done(self, output_index: int, item: ResponseOutputItem) -> None: ...

    def open_client_call(self, tool: str) -> OpenItem:
        """A call to a client-run tool (``shell``, ``local_shell``, ``apply_patch``): its
        arguments are kept as they stream (`text` sends nothing) and the item is announced at
        `close`, once they parse into its action."""
        kind = CLIENT_CALL_KINDS[tool]
        item_id, call_id = new_item_id(kind), builders.new_call_id()
        return OpenItem(kind, item_id, self._output_index(), name=tool, call_id=call_id)

    def _close_client_call(self, item: OpenItem, status: ItemStatus) -> bool:
        """The call's ``output_item.added``, its events and ``output_item.done``, at once; False
        when its arguments do not parse: ``item`` is then a ``function_call``, announced with
        its arguments, for `close` to end as one."""
        final = call_item(item, status)
        if final is None:
            item.kind, item.item_id = ItemKind.FUNCTION_CALL, builders.new_function_call_id()
            self._open(item)
            self._events.append(delta_event(item, item.text, self._seq()))
            return False
        self._events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                output_index=item.output_index,
                item=in_progress(final),
                sequence_number=self._seq(),
            )
        )
        self._events += command_events(final, item.output_index, self._seq)
        self._tool_calls += 1
        self._item_done(item.output_index, final)
        return True
