"""An MCP server's tools are shown to the model as a harmony namespace named by its label, with
their full input schemas; MCP history items render as the calls and outputs they were."""

from __future__ import annotations

from datetime import UTC, datetime

from serve_app.harmony.mcp_tools import DENIED, UNANSWERED, listed_specs, reusable_lists
from serve_app.harmony.render import render_request
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.mcp_items import McpListedTool, McpTool
from serve_app.protocol.requests import ResponsesRequest
from tests.support import MODEL
from tests.support.helpers import decode

NOW = datetime(2026, 11, 22, tzinfo=UTC)
SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "What to say back"}},
    "required": ["text"],
}
LISTED = [
    McpListedTool(name="echo", input_schema=SCHEMA, description="Say it back."),
    McpListedTool(name="wipe", input_schema={"type": "object"}, description="Wipe it."),
]


def mcp(**fields: object) -> dict:
    return {
        "type": "mcp",
        "server_label": "docs",
        "server_url": "http://127.0.0.1:9/mcp",
        "server_description": "The docs server.",
        **fields,
    }


def rendered(body: dict, listed: list[McpListedTool] = LISTED) -> str:
    request = ResponsesRequest.model_validate({"model": MODEL, **body})
    tool = next(tool for tool in request.tools if isinstance(tool, McpTool))
    tools = ToolRegistry.from_request(request, listed_specs(tool, listed))
    return decode(render_request(request, now=NOW, tools=tools).token_ids)


def test_a_servers_tools_are_a_namespace_with_full_schemas_and_allowed_tools_filters() -> None:
    text = rendered({"input": "hi", "tools": [mcp(allowed_tools=["echo"])]})
    developer = text.split("<|start|>developer<|message|>", 1)[1].split("<|end|>", 1)[0]
    assert "## docs\n\n// The docs server.\nnamespace docs {" in developer
    assert (
        "// Say it back.\ntype echo = (_: {\n// What to say back\ntext: string,\n}) => any;"
        in developer
    )
    assert "wipe" not in developer  # allowed_tools left it out


def test_the_registry_resolves_label_dot_tool_to_the_kind_the_approval_rule_gives() -> None:
    request = ResponsesRequest.model_validate(
        {
            "model": MODEL,
            "input": "hi",
            "tools": [mcp(require_approval={"never": {"tool_names": ["echo"]}})],
        }
    )
    tool = request.tools[0]
    assert isinstance(tool, McpTool)
    tools = ToolRegistry.from_request(request, listed_specs(tool, LISTED))
    echo, wipe = tools.resolve("docs.echo"), tools.resolve("docs.wipe")
    assert echo is not None and echo.kind == "mcp" and echo.namespace == "docs"
    assert wipe is not None and wipe.kind == "mcp_approval"


def _list_item() -> dict:
    return {
        "type": "mcp_list_tools",
        "id": "mcpl_1",
        "server_label": "docs",
        "tools": [tool.model_dump() for tool in LISTED],
    }


def _request_item(item_id: str = "mcpr_1") -> dict:
    return {
        "type": "mcp_approval_request",
        "id": item_id,
        "server_label": "docs",
        "name": "wipe",
        "arguments": '{"all":true}',
    }


CALL = (
    "<|start|>assistant<|channel|>commentary to=docs.wipe <|constrain|>json<|message|>"
    '{"all":true}<|call|>'
)


def _result(text: str) -> str:
    return f"<|start|>docs.wipe<|channel|>commentary to=assistant<|message|>{text}<|end|>"


def test_mcp_calls_render_as_call_and_output_and_an_error_as_its_text() -> None:
    items = [
        {"role": "user", "content": "wipe"},
        _list_item(),
        {
            "type": "mcp_call",
            "id": "mcp_1",
            "server_label": "docs",
            "name": "wipe",
            "arguments": '{"all":true}',
            "output": "wiped",
        },
        {
            "type": "mcp_call",
            "id": "mcp_2",
            "server_label": "docs",
            "name": "wipe",
            "arguments": '{"all":true}',
            "error": {"type": "http_error", "code": 500, "message": "boom"},
        },
    ]
    text = rendered({"input": items, "tools": [mcp()]})
    assert CALL + _result("wiped") + CALL + _result("Error: boom") in text
    assert "mcpl_1" not in text  # the listing is the developer message's tools, not a message


def test_approval_requests_render_with_the_clients_answer() -> None:
    approved_and_ran = [
        _request_item(),
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True},
        {
            "type": "mcp_call",
            "id": "mcp_1",
            "server_label": "docs",
            "name": "wipe",
            "arguments": '{"all":true}',
            "output": "wiped",
            "approval_request_id": "mcpr_1",
        },
    ]
    text = rendered(
        {"input": [{"role": "user", "content": "go"}, *approved_and_ran], "tools": [mcp()]}
    )
    assert text.count(CALL) == 1 and CALL + _result("wiped") in text
    denied = [
        _request_item(),
        {
            "type": "mcp_approval_response",
            "approval_request_id": "mcpr_1",
            "approve": False,
            "reason": "too risky",
        },
    ]
    text = rendered({"input": [{"role": "user", "content": "go"}, *denied], "tools": [mcp()]})
    assert CALL + _result(f"{DENIED} Reason: too risky") in text
    text = rendered(
        {"input": [{"role": "user", "content": "go"}, _request_item()], "tools": [mcp()]}
    )
    assert CALL + _result(UNANSWERED) in text


def test_a_listing_in_the_context_is_reused_and_a_failed_one_is_not() -> None:
    from serve_app.protocol.requests import ResponsesRequest as Request

    items = Request.model_validate(
        {
            "model": MODEL,
            "input": [
                _list_item(),
                {
                    **_list_item(),
                    "id": "mcpl_2",
                    "server_label": "other",
                    "tools": [],
                    "error": "down",
                },
            ],
        }
    ).input_items
    found = reusable_lists(items)
    assert list(found) == ["docs"] and [tool.name for tool in found["docs"].tools] == [
        "echo",
        "wipe",
    ]
