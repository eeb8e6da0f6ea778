"""The rules on a request's ``mcp`` tools and MCP items, before any server is reached: each
tool names a server by ``server_url`` (no connectors or tunnels), under the operator's
allowlist (serve_app.serving.tools.mcp.policy), by a label no other tool uses, with no
hop-by-hop or routing header among its ``headers`` (a request never picks the virtual host
behind an allowed address); every ``mcp_approval_response`` answers an approval request of its
context, and one that approves answers a request this server issued to this owner, for the
server the request names (serve_app.serving.tools.mcp_trust): a client cannot have a call run
that no model asked for."""

from __future__ import annotations

from collections.abc import Sequence

from serve_app.config import ToolArgs
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.mcp_items import McpApprovalRequestItem, McpApprovalResponseItem, McpTool
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.serving.tools.mcp.policy import check_headers, check_server_url
from serve_app.serving.tools.mcp_trust import TrustedMcp


def check_mcp(
    args: ToolArgs,
    request: ResponsesRequest,
    items: Sequence[InputItem],
    first_input: int,
    trusted: TrustedMcp,
) -> None:
    """Both rules: ``items`` the history and input, the input from ``first_input`` on;
    ``trusted`` the context's MCP items this server issued to the owner."""
    check_mcp_tools(request, args)
    check_approvals(items, first_input, trusted)


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


NOTHING_TRUSTED = TrustedMcp()


def check_approvals(
    items: Sequence[InputItem], first_input: int, trusted: TrustedMcp = NOTHING_TRUSTED
) -> None:
    """Every ``mcp_approval_response`` of the input answers an ``mcp_approval_request`` of
    the context, and an approving one a request in ``trusted`` (a 400 naming it otherwise:
    OpenAI's words for an id it does not know, and why, for one it knows but did not ask)."""
    asked = {item.id for item in items if isinstance(item, McpApprovalRequestItem)}
    for index, item in enumerate(items[first_input:]):
        if not isinstance(item, McpApprovalResponseItem):
            continue
        param = f"input[{index}].approval_request_id"
        if item.approval_request_id not in asked:
            raise InvalidRequest(
                f"No approval request found with id '{item.approval_request_id}'.",
                param=param,
                code="invalid_value",
            )
        if item.approve and item.approval_request_id not in trusted.approvals:
            raise InvalidRequest(
                f"No approval request found with id '{item.approval_request_id}' that this "
                "server issued to this API key for the server_label and server_url this "
                "request names: an approval runs only a call the model asked for here.",
                param=param,
                code="invalid_value",
            )
