"""The writer's calls to client-run tools (serve_app/protocol/client_tool_events.py): the
arguments the model streams become one ``shell_call``, ``local_shell_call`` or
``apply_patch_call`` item, announced when the call ends, every event as the openai SDK types it
and read back through its stream accumulator."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import (
    ResponseApplyPatchToolCall,
    ResponseFunctionShellToolCall,
    ResponseFunctionToolCall,
    ResponseOutputItem,
)
from openai.types.responses.response_output_item import LocalShellCall
from pydantic import TypeAdapter

from tests.unit.protocol.test_stream_events import new_writer, wire

OUTPUT_ITEM = TypeAdapter(ResponseOutputItem)


def streamed_call(tool: str, arguments: str, status: str = "completed") -> list[dict]:
    """The events of one call to ``tool`` whose arguments stream in three pieces, as a client
    reads them (the SDK's accumulator over the whole stream); the call's own events only."""
    writer = new_writer()
    writer.start()
    started = writer.take_events()
    item = writer.open_client_call(tool)
    cut = len(arguments) // 3
    for piece in (arguments[:cut], arguments[cut : 2 * cut], arguments[2 * cut :]):
        writer.text(item, piece)
    assert writer.take_events() == []  # nothing is announced before the call ends
    writer.close(item, status)  # type: ignore[arg-type]
    assert writer.tool_calls == 1  # it counts toward max_tool_calls
    writer.finish("completed", None)
    writer._events[:0] = started  # the whole stream, for the SDK's accumulator
    events = wire(writer)
    final = writer.response.output
    for done in final:  # each item as the SDK's output item union reads it back
        assert type(OUTPUT_ITEM.validate_json(done.model_dump_json())) is type(done)
    assert events[-1]["response"]["output"] == [events[-2]["item"]]
    return events[2:-1]


def test_a_shell_call_is_announced_with_its_commands_and_their_events() -> None:
    arguments = json.dumps({"commands": ["ls -la", "cat a.txt"], "timeout_ms": 500})
    events = streamed_call("shell", arguments)
    assert [event["type"] for event in events] == [
        "response.output_item.added",
        *["response.shell_call_command.added", "response.shell_call_command.delta"],
        "response.shell_call_command.done",
        *["response.shell_call_command.added", "response.shell_call_command.delta"],
        "response.shell_call_command.done",
        "response.output_item.done",
    ]
    added, done = events[0]["item"], events[-1]["item"]
    assert added["status"] == "in_progress" and done["status"] == "completed"
    call = ResponseFunctionShellToolCall.model_validate(done)
    assert call.id.startswith("sh_") and call.call_id.startswith("call_")
    assert call.action.commands == ["ls -la", "cat a.txt"]
    assert call.action.timeout_ms == 500 and call.action.max_output_length is None
    assert call.environment is not None and call.environment.type == "local"
    assert [e["command"] for e in events if e["type"].endswith("command.done")] == [
        "ls -la",
        "cat a.txt",
    ]
    numbers = [event["sequence_number"] for event in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(events)))
    assert {event["output_index"] for event in events} == {0}


def test_a_local_shell_call_carries_its_exec_action() -> None:
    arguments = json.dumps(
        {
            "command": ["bash", "-lc", "pwd"],
            "env": {"A": "1"},
            "timeout_ms": None,
            "user": None,
            "working_directory": "/tmp",
        }
    )
    events = streamed_call("local_shell", arguments)
    assert [event["type"] for event in events] == [
        "response.output_item.added",
        "response.output_item.done",
    ]
    call = LocalShellCall.model_validate(events[-1]["item"])
    assert call.id.startswith("lsh_") and call.status == "completed"
    assert call.action.type == "exec" and call.action.command == ["bash", "-lc", "pwd"]
    assert call.action.env == {"A": "1"} and call.action.working_directory == "/tmp"


@pytest.mark.parametrize(
    ("operation", "expected"),
    [
        (
            {"type": "create_file", "path": "a.txt", "diff": "+hello\n"},
            {"type": "create_file", "path": "a.txt", "diff": "+hello\n"},
        ),
        (
            {"type": "update_file", "path": "a.txt", "diff": "@@\n-hello\n+bye\n"},
            {"type": "update_file", "path": "a.txt", "diff": "@@\n-hello\n+bye\n"},
        ),
        # The model writes an empty diff for a deletion; the operation has none.
        (
            {"type": "delete_file", "path": "a.txt", "diff": ""},
            {"type": "delete_file", "path": "a.txt"},
        ),
    ],
)
def test_an_apply_patch_call_carries_its_operation(operation: dict, expected: dict) -> None:
    events = streamed_call("apply_patch", json.dumps(operation))
    call = ResponseApplyPatchToolCall.model_validate(events[-1]["item"])
    assert call.id.startswith("apc_")
    assert call.operation.model_dump(exclude_none=True) == expected
    assert events[-1]["item"]["operation"] == expected


@pytest.mark.parametrize(
    ("tool", "arguments", "status"),
    [
        ("shell", '{"commands": ["ls"', "incomplete"),  # cut short by max_output_tokens
        ("shell", '{"commands": "ls"}', "completed"),  # not the tool's arguments
        ("local_shell", "[]", "completed"),
        ("apply_patch", '{"type": "rename_file", "path": "a"}', "completed"),
        ("apply_patch", '{"type": "create_file", "path": "a", "diff": "+a"}', "incomplete"),
    ],
)
def test_arguments_that_are_not_the_tools_are_sent_as_a_function_call(
    tool: str, arguments: str, status: str
) -> None:
    events = streamed_call(tool, arguments, status)
    assert [event["type"] for event in events] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    call = ResponseFunctionToolCall.model_validate(events[-1]["item"])
    assert (call.name, call.arguments, call.status) == (tool, arguments, status)
    assert call.id is not None and call.id.startswith("fc_")
