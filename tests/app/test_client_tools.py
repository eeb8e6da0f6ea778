"""Tools the client runs (``shell``, ``local_shell``, ``apply_patch``) through the openai SDK
against the running app: the model's call comes back as the tool's own item (streamed with its
events), the response ends, and the client's output item, sent by ``previous_response_id``, in
a conversation or resent whole, is what the model's next turn reads (the scripted turns
``CLIENT-*`` in tests/fixtures/engine_script.yaml answer only when they see the tool's output).
What cannot be shown is a 400 naming the field."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types.responses import ResponseFunctionShellToolCallOutput

from tests.support import MODEL
from tests.support.websocket import connected, until, until_terminal

SHELL = {"type": "shell", "environment": {"type": "local"}}
SHELL_OUTPUT = [
    {"stdout": "shell-out-4711\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
]


def shell_output(call_id: str) -> dict[str, Any]:
    return {"type": "shell_call_output", "call_id": call_id, "output": SHELL_OUTPUT}


def test_a_shell_call_streams_as_its_item_and_its_output_is_read_by_the_next_turn(
    client: OpenAI,
) -> None:
    with client.responses.stream(model=MODEL, input="CLIENT-SHELL-TASK", tools=[SHELL]) as stream:
        types = [event.type for event in stream]
        first = stream.get_final_response()
    assert first.status == "completed"
    reasoning, call = first.output
    assert reasoning.type == "reasoning"
    assert call.type == "shell_call" and call.status == "completed"
    assert call.action.commands == ["echo shell-out-4711 > shell.txt", "cat shell.txt"]
    assert call.action.timeout_ms == 10000 and call.environment.type == "local"
    assert types.count("response.shell_call_command.done") == 2
    assert [tool.type for tool in first.tools] == ["shell"]  # echoed as sent

    # The call is stored as sent: retrieving and listing it gives the same item.
    assert client.responses.retrieve(first.id).output[1] == call
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[shell_output(call.call_id)],
        tools=[SHELL],
    )
    assert second.output_text == "The shell printed shell-out-4711."
    (listed,) = client.responses.input_items.list(second.id).data
    # Listed as the SDK types it (an id minted, the status kept), strictly validated.
    stored = ResponseFunctionShellToolCallOutput.model_validate(listed.model_dump())
    assert stored.call_id == call.call_id and stored.status == "completed"
    assert stored.id.startswith("sho_") and stored.output[0].stdout == "shell-out-4711\n"


def test_stateless_resend_and_a_conversation_carry_the_call_and_its_output(client: OpenAI) -> None:
    task = {"role": "user", "content": "CLIENT-SHELL-TASK"}
    first = client.responses.create(model=MODEL, input=[task], tools=[SHELL], store=False)
    call = first.output[-1]
    history = [task, *[item.model_dump(exclude_none=True) for item in first.output]]
    resent = client.responses.create(
        model=MODEL, input=[*history, shell_output(call.call_id)], tools=[SHELL], store=False
    )
    assert resent.output_text == "The shell printed shell-out-4711."

    conversation = client.conversations.create()
    asked = client.responses.create(
        model=MODEL, conversation=conversation.id, input="CLIENT-SHELL-TASK", tools=[SHELL]
    )
    answered = client.responses.create(
        model=MODEL,
        conversation=conversation.id,
        input=[shell_output(asked.output[-1].call_id)],
        tools=[SHELL],
    )
    assert answered.output_text == "The shell printed shell-out-4711."
    kept = [item.type for item in client.conversations.items.list(conversation.id, order="asc")]
    assert kept == [
        "message",
        "reasoning",
        "shell_call",
        "shell_call_output",
        "reasoning",
        "message",
    ]


def test_an_apply_patch_call_carries_its_operation_and_its_output_is_read(client: OpenAI) -> None:
    tools = [{"type": "apply_patch"}]
    first = client.responses.create(model=MODEL, input="CLIENT-PATCH-TASK", tools=tools)
    call = first.output[-1]
    assert call.type == "apply_patch_call"
    assert call.operation.type == "create_file" and call.operation.path == "hello.txt"
    assert call.operation.diff == "+patched-hello-4711\n"
    output = {
        "type": "apply_patch_call_output",
        "call_id": call.call_id,
        "status": "completed",
        "output": "patch-done-4711",
    }
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[output], tools=tools
    )
    assert second.output_text == "Patched: hello.txt holds patched-hello-4711."


def test_a_local_shell_output_may_name_its_call_by_id(client: OpenAI) -> None:
    tools = [{"type": "local_shell"}]
    first = client.responses.create(model=MODEL, input="CLIENT-LSHELL-TASK", tools=tools)
    (call,) = first.output
    assert call.type == "local_shell_call"
    assert call.action.command == ["bash", "-lc", "echo localrun-4711"]
    assert call.action.env == {"GREETING": "hi"}
    # The SDK's LocalShellCallOutput names the call by `id`.
    output = {"type": "local_shell_call_output", "id": call.call_id, "output": "localrun-4711\n"}
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[output], tools=tools
    )
    assert second.output_text == "The local shell printed localrun-4711."


def test_over_a_websocket_steering_waits_for_the_shell_calls_output(client: OpenAI) -> None:
    """The client owes a shell call's output: input steered in after the call, the response
    still running, waits for that output, and ``response.steer.pending`` names it as the input
    required.

    Steered once the call's item is done (the event the client sees; a shell call's item is
    announced only once written), not at ``response.in_progress``: that comes when the engine
    took the request, before its first token, and a steer then ends the response at once,
    empty (nothing open: a safe boundary). The first constrained request of an engine process
    waits seconds for the grammar vocabulary before that token (constrained.py), so a steer
    after ``in_progress`` lost that race in CI. Steering mid-call is the function-call twin
    in test_websocket_lanes.py, which has an event to wait for (its arguments' deltas)."""
    with connected(client) as connection:
        connection.response.create(model=MODEL, input="STEER-SHELL", tools=[SHELL], stream_id="s")
        first = until(
            connection,
            lambda event: (
                event.type == "response.output_item.done" and event.item.type == "shell_call"
            ),
        )
        connection.response.steer(
            previous_response_id=first[0].response.id,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "and pwd"}]}],
        )
        first += until_terminal(connection)
        # Refused (the response over before the steer came): said here, not as a wait for a
        # pending event that never comes.
        assert not [event for event in first if event.type == "response.steer.failed"], first
        completed = first[-1]
        assert completed.type == "response.completed", [event.type for event in first]
        (call,) = completed.response.output
        assert call.type == "shell_call" and call.action.commands == ["ls"]
        pending = connection.recv()
        assert pending.type == "response.steer.pending", pending
        assert pending.reason == "waiting_for_required_input"
        assert [stub.model_dump() for stub in pending.required_input] == [
            {"type": "shell_call_output", "call_id": call.call_id}
        ]
        # The continuation on that lane carries the steered input before the tool's output.
        connection.response.create(
            model=MODEL,
            input=[shell_output(call.call_id)],
            tools=[SHELL],
            previous_response_id=completed.response.id,
            stream_id="s",
        )
        done = until_terminal(connection)[-1]
    assert done.type == "response.completed", done
    assert done.response.output_text == "The shell printed shell-out-4711."
    items = client.responses.input_items.list(done.response.id, order="asc").data
    assert [item.type for item in items] == ["message", "shell_call_output"]


def test_the_tools_are_shown_to_the_model(client: OpenAI) -> None:
    def count(**options: Any) -> int:
        return client.responses.input_tokens.count(model=MODEL, input="hi", **options).input_tokens

    bare = count()
    for tool in (SHELL, {"type": "local_shell"}, {"type": "apply_patch"}):
        assert count(tools=[tool]) > bare + 50, tool


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "tools": [
                    {
                        "type": "computer_use_preview",
                        "display_width": 1024,
                        "display_height": 768,
                        "environment": "linux",
                    }
                ]
            },
            "tools[0].type",
        ),
        (
            {"tools": [{"type": "shell", "environment": {"type": "container_auto"}}]},
            "tools[0].environment.type",
        ),
        (
            {
                "tools": [{"type": "function", "name": "get_weather"}],
                "tool_choice": {"type": "shell"},
            },
            "tool_choice",
        ),
        ({"tools": [SHELL, {"type": "function", "name": "shell"}]}, "tools[1]"),
        (
            {
                "input": [
                    {"type": "shell_call_output", "call_id": "call_x", "output": SHELL_OUTPUT}
                ],
                "tools": [SHELL],
            },
            "input[0].call_id",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {
                        "type": "apply_patch_call",
                        "call_id": "call_p",
                        "status": "completed",
                        "operation": {"type": "delete_file", "path": "a"},
                    },
                ],
                "tools": [{"type": "apply_patch"}],
            },
            "input[1].call_id",
        ),
        (
            {"input": [{"type": "shell_call", "call_id": "c", "action": {"commands": "ls"}}]},
            "input[0].action.commands",
        ),
    ],
    ids=[
        "computer",
        "container",
        "choice-without-tool",
        "name-taken",
        "output-without-call",
        "call-without-output",
        "bad-action",
    ],
)
def test_what_cannot_be_shown_or_paired_is_a_400_naming_it(
    client: OpenAI, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model=MODEL, **{"input": "hi", **body})
    assert error.value.status_code == 400
    assert error.value.body["param"] == param, error.value.body
