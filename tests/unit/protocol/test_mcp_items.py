"""The `mcp` tool and the MCP input items parse as the openai SDK types them; the tool's
filters decide what the model sees and what waits for approval; credentials never show."""

from __future__ import annotations

import pytest
from openai.types.responses import Tool
from pydantic import TypeAdapter, ValidationError

from serve_app.protocol.mcp_items import McpCallItem, McpTool, error_text
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.responses import dump_response, initial_response, new_response_id
from tests.support import MODEL

SECRET = "sk-mcp-secret-token"


def mcp(**fields: object) -> dict:
    return {"type": "mcp", "server_label": "docs", "server_url": "http://127.0.0.1:9/mcp", **fields}


def request(*tools: dict, items: list | None = None) -> ResponsesRequest:
    return ResponsesRequest.model_validate(
        {"model": MODEL, "input": items or "hi", "tools": list(tools)}
    )


def test_the_mcp_tool_parses_every_field_of_the_sdk_type() -> None:
    tool = request(
        mcp(
            allowed_tools={"tool_names": ["echo"], "read_only": True},
            headers={"X-Key": SECRET},
            authorization=SECRET,
            require_approval={"never": {"tool_names": ["echo"]}},
            server_description="Docs",
        )
    ).tools[0]
    assert isinstance(tool, McpTool)
    assert tool.headers == {"X-Key": SECRET} and tool.authorization == SECRET
    assert SECRET not in repr(tool) and SECRET not in str(tool)


@pytest.mark.parametrize(
    ("allowed", "name", "read_only", "shown"),
    [
        (None, "any", False, True),
        (["echo"], "echo", False, True),
        (["echo"], "add", False, False),
        ({"tool_names": ["echo"]}, "add", False, False),
        ({"read_only": True}, "add", False, False),
        ({"read_only": True}, "add", True, True),
        ({"tool_names": ["add"], "read_only": True}, "add", False, False),
    ],
)
def test_allowed_tools_names_or_filter(allowed, name, read_only, shown) -> None:
    tool = request(mcp(allowed_tools=allowed)).tools[0]
    assert isinstance(tool, McpTool)
    assert tool.allows(name, read_only) is shown


@pytest.mark.parametrize(
    ("rule", "name", "read_only", "needs"),
    [
        (None, "echo", False, True),  # OpenAI's default: every call is approved first
        ("always", "echo", False, True),
        ("never", "echo", False, False),
        ({"never": {"tool_names": ["echo"]}}, "echo", False, False),
        ({"never": {"tool_names": ["echo"]}}, "add", False, True),
        ({"always": {"tool_names": ["add"]}}, "echo", False, False),
        ({"always": {"tool_names": ["add"]}}, "add", False, True),
        ({"never": {"read_only": True}}, "look", True, False),
    ],
)
def test_require_approval_always_never_or_per_tool(rule, name, read_only, needs) -> None:
    tool = request(mcp(require_approval=rule)).tools[0]
    assert isinstance(tool, McpTool)
    assert tool.needs_approval(name, read_only) is needs


def test_the_response_echoes_the_tool_without_its_credentials() -> None:
    body = request(mcp(headers={"X-Key": SECRET}, authorization=SECRET, allowed_tools=["echo"]))
    response = initial_response(body, response_id=new_response_id(), model=MODEL)
    dumped = dump_response(response)
    assert SECRET not in str(dumped)
    (echoed,) = dumped["tools"]
    assert echoed["type"] == "mcp" and echoed["server_label"] == "docs"
    assert echoed["allowed_tools"] == ["echo"] and echoed["require_approval"] == "always"
    assert "authorization" not in echoed and "headers" not in echoed
    TypeAdapter(Tool).validate_python(echoed)  # as the SDK types it


def test_mcp_input_items_parse_as_the_sdk_types_them() -> None:
    items = [
        {
            "type": "mcp_list_tools",
            "id": "mcpl_1",
            "server_label": "docs",
            "tools": [{"name": "echo", "input_schema": {"type": "object"}, "annotations": None}],
        },
        {
            "type": "mcp_call",
            "id": "mcp_1",
            "server_label": "docs",
            "name": "echo",
            "arguments": "{}",
            "output": "hi",
            "error": None,
            "status": "completed",
        },
        {
            "type": "mcp_call",
            "id": "mcp_2",
            "server_label": "docs",
            "name": "echo",
            "arguments": "{}",
            "error": {"type": "mcp_protocol_error", "code": -32602, "message": "bad"},
        },
        {
            "type": "mcp_approval_request",
            "id": "mcpr_1",
            "server_label": "docs",
            "name": "echo",
            "arguments": "{}",
        },
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True},
    ]
    parsed = request(items=items).input_items
    assert [item.type for item in parsed] == [item["type"] for item in items]
    assert isinstance(parsed[2], McpCallItem) and error_text(parsed[2].error) == "bad"


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        (mcp(server_label="has space"), "tools[0].server_label"),
        (mcp(require_approval="sometimes"), "tools[0].require_approval"),
        (mcp(headers={"X": 1}), "tools[0].headers.X"),
    ],
)
def test_a_malformed_mcp_tool_is_a_400_naming_its_field(tool, param) -> None:
    from serve_app.protocol.body_errors import from_validation_errors

    with pytest.raises(ValidationError) as caught:
        request(tool)
    error = from_validation_errors(caught.value.errors())
    assert error.param == param
    assert SECRET not in error.message
