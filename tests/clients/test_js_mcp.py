"""The Agents JS SDK's hosted MCP tool (`hostedMcpTool` with `onApproval`) against the app:
an approval round trip, approved and denied (tests/js/mcp_scenarios.mjs), with the `mcp` SDK's
test server on an allowlisted port (tests/support/mcp_app.py)."""

from __future__ import annotations

import pytest

from tests.support import js_scenarios
from tests.support.mcp_app import port
from tests.support.mcp_servers import mcp_server

SCRIPT = "mcp_scenarios.mjs"


@pytest.mark.parametrize("scenario", ["agents-approval", "agents-denial"])
def test_agents_js_hosted_mcp_tool_approval_round_trip(app_url: str, scenario: str) -> None:
    with mcp_server("good", port=port("agents")) as server:
        output = js_scenarios.run(SCRIPT, scenario, app_url, MCP_SERVER_URL=server.url)
    result, sent = output["result"], output["requests"]
    assert [(ask["label"], ask["name"], ask["arguments"]) for ask in result["asked"]] == [
        ("docs", "echo", '{"text": "MCP-ECHOED-7"}')
    ]
    assert all(request["status"] == 200 for request in sent) and len(sent) == 2
    (tool,) = sent[0]["body"]["tools"]
    assert tool["type"] == "mcp" and tool["require_approval"] == "always"
    answer = [
        item for item in sent[1]["body"]["input"] if item.get("type") == "mcp_approval_response"
    ]
    assert len(answer) == 1 and answer[0]["approve"] is (scenario == "agents-approval")
    ran = [call["output"] for call in result["calls"] if call["type"] == "mcp_call"]
    if scenario == "agents-approval":
        assert ran == ["MCP-ECHOED-7"]
        assert result["finalOutput"] == "The server said MCP-ECHOED-7."
    else:
        assert ran == []
        assert result["finalOutput"] == "The call was denied, so I did not run it."
