"""The client-run tools as gpt-oss sees them (serve_app/harmony/client_tools.py): shown as
strict functions in the developer message, the model's calls to them translated into their own
items (real harmony token ids through the stream translator, read back by the openai SDK's
accumulator), and their calls and outputs rendered back into the prompt of the next turn."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState

from serve_app.constraints.build import from_request
from serve_app.constraints.validate import first_unenforceable
from serve_app.harmony.render import render_request
from serve_app.harmony.stream import ResponseStreamTranslator
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import initial_response, new_response_id
from serve_app.protocol.sse import encode_event
from tests.support import MODEL
from tests.support.helpers import decode
from tests.unit.harmony.test_stream import EVENT, chunked, decode_sse, tokens

TOOLS = [
    {"type": "shell", "environment": {"type": "local"}},
    {"type": "local_shell"},
    {"type": "apply_patch"},
]
SHELL_ARGS = {
    "commands": ["ls -la", "cat notes.txt"],
    "timeout_ms": None,
    "max_output_length": 2000,
}
PATCH_ARGS = {"type": "update_file", "path": "a.py", "diff": "@@\n-x = 1\n+x = 2\n"}


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate(
        {"model": MODEL, "input": "do it", "tools": TOOLS, **fields}
    )


def prompt(req: ResponsesRequest) -> str:
    return decode(render_request(req).token_ids)


def test_each_client_tool_is_shown_as_a_function_named_after_its_type() -> None:
    text = prompt(request())
    assert "namespace functions {" in text
    assert (
        "type shell = (_: {\n// The shell command lines to run, in order.\ncommands: string[],"
        in text
    )
    assert "type local_shell = (_: {" in text and "env: Record<string, string>," in text
    assert 'type: "create_file" | "update_file" | "delete_file",' in text
    # The descriptions teach the tools: V4A hunks for apply_patch.
    assert "V4A diff format" in text and "prefixed with `+`" in text
    # Calls go to the commentary channel, as for any function tool.
    assert "Calls to these tools must go to the commentary channel" in text


def test_the_schemas_are_enforced_by_constrained_decoding() -> None:
    req = request()
    tools = ToolRegistry.from_request(req)
    constraint = from_request(req, tools)
    assert constraint is not None
    bodies = {rule.recipient: rule.body for rule in constraint.tool_calls}
    assert set(bodies) == {"functions.shell", "functions.local_shell", "functions.apply_patch"}
    assert all(body.kind == "json" for body in bodies.values())
    assert first_unenforceable(req, tools) is None  # each compiles


@pytest.mark.parametrize(
    ("choice", "name"), [({"type": "shell"}, "shell"), ({"type": "apply_patch"}, "apply_patch")]
)
def test_a_client_tool_choice_forces_that_tool(choice: dict, name: str) -> None:
    tools = ToolRegistry.from_request(request(tool_choice=choice))
    assert [spec.name for spec in tools.tools] == [name] and tools.required


def test_allowed_tools_names_client_tools_by_type() -> None:
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "apply_patch"}]}
    tools = ToolRegistry.from_request(request(tool_choice=choice))
    assert tools.allowed == {"apply_patch"} and tools.required


# --- the model's calls -----------------------------------------------------------------------


def translate(
    harmony: str, sizes: tuple[int, ...], max_tool_calls: int | None = None
) -> list[dict[str, Any]]:
    """The wire events of a completion, checked by the SDK's accumulator."""
    req = request()
    response = initial_response(req, response_id=new_response_id(), model=MODEL)
    translator = ResponseStreamTranslator(
        response, ToolRegistry.from_request(req), max_tool_calls=max_tool_calls
    )
    events = translator.start()
    for chunk in chunked(tokens(harmony), sizes):
        events += translator.feed(chunk)
    events += translator.finish("stop", prompt_tokens=10, cached_tokens=0)
    wire = [decode_sse(encode_event(event)) for event in events]
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for data in wire:
        state.handle_event(EVENT.validate_python(data))
    assert [event["sequence_number"] for event in wire] == list(range(len(wire)))
    assert state._completed_response is not None
    return wire


def call(recipient: str, arguments: dict[str, Any]) -> str:
    body = json.dumps(arguments, separators=(",", ":"))
    return f"<|channel|>commentary to={recipient} <|constrain|>json<|message|>{body}<|call|>"


@pytest.mark.parametrize("sizes", [(1,), (3, 7), (1000,)], ids=str)
def test_the_models_calls_become_the_tools_items_in_its_order(sizes: tuple[int, ...]) -> None:
    local = {
        "command": ["pwd"],
        "env": {},
        "timeout_ms": 100,
        "user": None,
        "working_directory": None,
    }
    wire = translate(
        "<|channel|>analysis<|message|>Look, then patch.<|end|><|start|>assistant"
        + call("functions.shell", SHELL_ARGS)
        + "<|start|>assistant"
        + call("functions.local_shell", local)
        + "<|start|>assistant"
        + call("functions.apply_patch", PATCH_ARGS),
        sizes,
    )
    output = wire[-1]["response"]["output"]
    assert [item["type"] for item in output] == [
        "reasoning",
        "shell_call",
        "local_shell_call",
        "apply_patch_call",
    ]
    shell, local_call, patch = output[1:]
    assert shell["action"] == {
        "commands": SHELL_ARGS["commands"],
        "timeout_ms": None,
        "max_output_length": 2000,
    }
    assert local_call["action"]["command"] == ["pwd"] and local_call["action"]["type"] == "exec"
    assert patch["operation"] == PATCH_ARGS and patch["status"] == "completed"
    assert len({item["call_id"] for item in output[1:]}) == 3
    assert [e["output_index"] for e in wire if "output_index" in e] == sorted(
        e["output_index"] for e in wire if "output_index" in e
    )
    commands = [e["command"] for e in wire if e["type"] == "response.shell_call_command.done"]
    assert commands == SHELL_ARGS["commands"]
    assert wire[-1]["type"] == "response.completed"


@pytest.mark.parametrize("sizes", [(1,), (1000,)], ids=str)
def test_client_calls_count_toward_max_tool_calls(sizes: tuple[int, ...]) -> None:
    """What the model writes after the last call allowed is dropped, as for function calls."""
    two = call("functions.apply_patch", PATCH_ARGS) + call("functions.shell", SHELL_ARGS)
    wire = translate(two, sizes, max_tool_calls=1)
    assert [item["type"] for item in wire[-1]["response"]["output"]] == ["apply_patch_call"]
    assert not [e for e in wire if e["type"].startswith("response.shell_call")]


# --- the history -----------------------------------------------------------------------------


def test_calls_and_outputs_render_back_as_the_models_calls_and_the_tools_messages() -> None:
    history = [
        {"role": "user", "content": "Fix it."},
        {"type": "shell_call", "call_id": "c1", "action": SHELL_ARGS, "status": "completed"},
        {
            "type": "shell_call_output",
            "call_id": "c1",
            "output": [
                {"stdout": "a.py\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
                {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}},
            ],
        },
        {
            "type": "local_shell_call",
            "call_id": "c2",
            "action": {"type": "exec", "command": ["pwd"], "env": {}},
            "status": "completed",
        },
        # The SDK's own shape: the call named by `id`.
        {"type": "local_shell_call_output", "id": "c2", "output": '{"output": "/work"}'},
        {
            "type": "apply_patch_call",
            "call_id": "c3",
            "operation": PATCH_ARGS,
            "status": "completed",
        },
        {
            "type": "apply_patch_call_output",
            "call_id": "c3",
            "status": "failed",
            "output": "no a.py",
        },
    ]
    text = prompt(request(input=history))
    shell_body = json.dumps(SHELL_ARGS, separators=(",", ":"))
    assert (
        f"<|start|>assistant<|channel|>commentary to=functions.shell <|constrain|>json"
        f"<|message|>{shell_body}<|call|>"
    ) in text
    assert (
        '<|start|>functions.shell<|channel|>commentary to=assistant<|message|>[{"stdout": '
        '"a.py\\n", "stderr": "", "exit_code": 0}, {"stdout": "", "stderr": "", '
        '"timed_out": true}]<|end|>'
    ) in text
    assert (
        'to=functions.local_shell <|constrain|>json<|message|>{"command":["pwd"],"env":{}' in text
    )
    assert (
        "<|start|>functions.local_shell<|channel|>commentary to=assistant"
        '<|message|>{"output": "/work"}' in text
    )
    patch_body = json.dumps(PATCH_ARGS, separators=(",", ":"))
    assert f"to=functions.apply_patch <|constrain|>json<|message|>{patch_body}<|call|>" in text
    assert '<|message|>{"status": "failed", "output": "no a.py"}<|end|>' in text


def test_a_call_the_model_wrote_renders_back_as_it_wrote_it() -> None:
    """The next turn's prompt holds the call as the model wrote it: the engine's cached prefix
    for this conversation stays valid."""
    written = call("functions.apply_patch", PATCH_ARGS)
    wire = translate(written, (5,))
    item = wire[-1]["response"]["output"][0]
    output = {"type": "apply_patch_call_output", "call_id": item["call_id"], "status": "completed"}
    text = prompt(request(input=[{"role": "user", "content": "do it"}, item, output]))
    assert f"<|start|>assistant{written}" in text
