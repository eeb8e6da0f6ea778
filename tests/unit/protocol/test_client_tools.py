"""The client-run tools' request types (serve_app/protocol/client_tools.py): tools, calls and
outputs parsed as the openai SDK and the Agents SDKs send them, and echoed in the Response as
the SDK types them. (Every field's wrong JSON type is a 400 naming it:
tests/unit/protocol/test_requests.py sweeps them.)"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from serve_app.protocol.client_tools import (
    ApplyPatchCallItem,
    LocalShellCallOutputItem,
    ShellTool,
)
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.protocol.responses import initial_response, new_response_id
from tests.support import MODEL

ITEM = TypeAdapter(InputItem)
TOOLS = [
    {"type": "shell", "environment": {"type": "local"}},
    {"type": "apply_patch"},
    {"type": "local_shell"},
]


def test_a_local_shell_output_names_its_call_by_call_id_or_by_id() -> None:
    by_id = ITEM.validate_python({"type": "local_shell_call_output", "id": "call_1", "output": "x"})
    assert isinstance(by_id, LocalShellCallOutputItem) and by_id.call_id == "call_1"
    both = {"type": "local_shell_call_output", "id": "lsho_1", "call_id": "call_2", "output": "x"}
    assert ITEM.validate_python(both).call_id == "call_2"
    with pytest.raises(ValidationError, match="needs the `call_id`"):
        ITEM.validate_python({"type": "local_shell_call_output", "output": "x"})


@pytest.mark.parametrize(
    ("operation", "valid"),
    [
        ({"type": "delete_file", "path": "a"}, True),
        ({"type": "create_file", "path": "a", "diff": "+a"}, True),
        ({"type": "create_file", "path": "a"}, False),
        ({"type": "update_file", "path": "a"}, False),
        ({"type": "rename_file", "path": "a", "diff": ""}, False),
    ],
)
def test_an_apply_patch_operation_needs_a_diff_unless_it_deletes(
    operation: dict, valid: bool
) -> None:
    item: dict[str, Any] = {"type": "apply_patch_call", "call_id": "c", "operation": operation}
    if valid:
        assert isinstance(ITEM.validate_python(item), ApplyPatchCallItem)
    else:
        with pytest.raises(ValidationError):
            ITEM.validate_python(item)


def test_a_shell_tool_without_an_environment_is_local() -> None:
    request = ResponsesRequest.model_validate({"model": MODEL, "tools": [{"type": "shell"}]})
    (tool,) = request.tools
    assert isinstance(tool, ShellTool) and tool.environment is None


@pytest.mark.parametrize("choice", [{"type": "shell"}, {"type": "apply_patch"}])
def test_the_response_echoes_the_tools_and_the_choice_as_the_sdk_types_them(choice: dict) -> None:
    request = ResponsesRequest.model_validate(
        {"model": MODEL, "tools": TOOLS, "tool_choice": choice}
    )
    response = initial_response(request, response_id=new_response_id(), model=MODEL)
    assert [tool.model_dump(exclude_none=True) for tool in response.tools] == TOOLS
    assert response.tool_choice.model_dump() == choice
