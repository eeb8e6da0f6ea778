"""The rules on a request's ``mcp`` tools and MCP items, before any server is reached: each
tool names a server by ``server_url`` (no connectors or tunnels), under the operator's
allowlist (serve_app.serving.tools.mcp.policy), by a label no other tool uses, with no
hop-by-hop or routing header among its ``headers`` (a request never picks the virtual host
behind an allowed address); every
``mcp_approval_response`` answers an approval request of its context."""

from __future__ import annotations

from collections.abc import Sequence

from serve_app.config import ToolArgs
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.mcp_items import McpApprovalRequestItem, McpApprovalResponseItem, McpTool
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.serving.tools.mcp.policy import check_headers, check_server_url


def check_mcp(
    args: ToolArgs, request: ResponsesRequest, items: Sequence[InputItem], first_input: int
) -> None:
    """Both rules: ``items`` the history and input, the input from ``first_input`` on."""
    check_mcp_tools(request, args)
    check_approvals(items, first_input)


def check_mcp_tools(request: ResponsesRequest, args: ToolArgs) -> None:
    labels: set[str] = set()
    for index, tool in enumerate(request.tools):
        if not isinstance(tool, McpTool):
            continue
        param = f"tools[{index}]"
        for unsupported in ("connector_id", "tunnel_id"):
            if getattr(tool, unsupported) is not None:
                raise InvalidRequest(
                    f"Invalid '{param}.{unsupported}': this server reaches MCP servers by "
                    "`server_url` only (no connectors or tunnels).",
                    param=f"{param}.{unsupported}",
                    code="invalid_value",
                )
        if tool.server_label in labels:
            raise InvalidRequest(
                f"Invalid '{param}.server_label': duplicate MCP server label "
                f"'{tool.server_label}'; each mcp tool needs its own.",
                param=f"{param}.server_label",
                code="invalid_value",
            )
        labels.add(tool.server_label)
        if not tool.server_url:
            raise InvalidRequest(
                f"Missing required parameter: '{param}.server_url'.",
                param=f"{param}.server_url",
                code="missing_required_parameter",
            )
        check_server_url(tool.server_url, f"{param}.server_url", args.mcp_allow)
        check_headers(tool.headers, f"{param}.headers")


def check_approvals(items: Sequence[InputItem], first_input: int) -> None:
    """Every ``mcp_approval_response`` of the input answers an ``mcp_approval_request`` of
    the context (a 400 naming it otherwise)."""
    asked = {item.id for item in items if isinstance(item, McpApprovalRequestItem)}
    for index, item in enumerate(items[first_input:]):
        if isinstance(item, McpApprovalResponseItem) and item.approval_request_id not in asked:
            raise InvalidRequest(
                f"No approval request found with id '{item.approval_request_id}'.",
                param=f"input[{index}].approval_request_id",
                code="invalid_value",
            )
