"""The door's rules on `mcp` tools: a clear 400 naming the field, before any connection."""

from __future__ import annotations

import pytest

from serve_app.config import ToolArgs
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.admission.mcp import NOTHING_TRUSTED, check_mcp
from serve_app.serving.tools.mcp_trust import TrustedMcp
from tests.support import MODEL

# Built per test: an import-time `ToolArgs` would take the serve tier's allowlist from the
# environment (tests/unit/conftest.py clears it for each test).
ALLOWED_URLS = ["http://127.0.0.1:9000/mcp"]


def mcp(**fields: object) -> dict:
    return {
        "type": "mcp",
        "server_label": "docs",
        "server_url": "http://127.0.0.1:9000/mcp",
        **fields,
    }


def check(
    tools: list[dict],
    items: list[dict] | None = None,
    history: int = 0,
    trusted: TrustedMcp = NOTHING_TRUSTED,
) -> None:
    request = ResponsesRequest.model_validate(
        {"model": MODEL, "input": items or "hi", "tools": tools}
    )
    check_mcp(ToolArgs(mcp_allow=ALLOWED_URLS), request, request.input_items, history, trusted)


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([mcp(server_url="http://127.0.0.1:9001/mcp")], "tools[0].server_url"),
        ([mcp(server_url="http://127.0.0.1:9000/mcpx")], "tools[0].server_url"),
        ([mcp(server_url="http://user:pw@127.0.0.1:9000/mcp")], "tools[0].server_url"),
        ([mcp(server_url="file:///etc/passwd")], "tools[0].server_url"),
        ([{"type": "function", "name": "f"}, mcp(server_url=None)], "tools[1].server_url"),
        ([mcp(connector_id="connector_gmail", server_url=None)], "tools[0].connector_id"),
        ([mcp(), mcp(server_url="http://127.0.0.1:9000/mcp/other")], "tools[1].server_label"),
    ],
)
def test_a_bad_mcp_tool_is_a_400_naming_its_field(tools, param) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check(tools)
    assert caught.value.param == param


def test_an_allowed_server_passes_and_an_unanswerable_approval_is_a_400() -> None:
    check([mcp(), mcp(server_label="more", server_url="http://127.0.0.1:9000/mcp/v2")])
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True}
    with pytest.raises(InvalidRequest) as caught:
        check([mcp()], [{"role": "user", "content": "hi"}, answer])
    assert caught.value.param == "input[1].approval_request_id"


ASKED = {
    "type": "mcp_approval_request",
    "id": "mcpr_1",
    "server_label": "docs",
    "name": "wipe",
    "arguments": "{}",
}


def test_an_approval_of_a_request_the_server_did_not_issue_is_a_400_a_denial_is_not() -> None:
    approve = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    with pytest.raises(InvalidRequest) as caught:
        check([mcp()], [ASKED, approve])
    assert caught.value.param == "input[1].approval_request_id"
    assert "issued to this API key" in caught.value.message
    check([mcp()], [ASKED, approve], trusted=TrustedMcp(approvals=frozenset({"mcpr_1"})))
    check([mcp()], [ASKED, {**approve, "approve": False}])  # runs nothing: as before


@pytest.mark.parametrize(
    "name",
    [
        "Host",
        "host",
        "HOST ",  # spaces around a name are no way round it
        "Connection",
        "Content-Length",
        "Transfer-Encoding",
        "TE",
        "Upgrade",
        "Keep-Alive",
        "Proxy-Authorization",
        "proxy-connection",
        "Forwarded",
        "X-Forwarded-For",
        "x-forwarded-host",
    ],
)
def test_a_hop_by_hop_or_routing_header_is_a_400_naming_it(name: str) -> None:
    """A request's headers may carry credentials, never pick the virtual host or speak for a
    proxy: those are a 400 naming the header, before any connection."""
    tools = [mcp(headers={"X-Tenant": "t1", name: "admin.internal"})]
    with pytest.raises(InvalidRequest) as caught:
        check(tools)
    assert caught.value.param == f"tools[0].headers.{name}"
    assert caught.value.code == "invalid_value"
    assert f"'tools[0].headers.{name}'" in caught.value.message


def test_credentials_and_other_headers_pass() -> None:
    check([mcp(headers={"Authorization": "Bearer t", "X-Tenant": "t1", "Hostname": "a"})])
