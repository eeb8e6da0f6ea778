"""The MCP client the server runs `mcp` tools with: what it may reach (policy.py), the pinned
and bounded HTTP client of a session (transport.py), listing and calling (client.py)."""

from serve_app.serving.tools.mcp.client import CallOutcome, ListOutcome, McpClient, McpServer
from serve_app.serving.tools.mcp.policy import ServerAddress, UnsafeAddress, check_server_url

__all__ = [
    "CallOutcome",
    "ListOutcome",
    "McpClient",
    "McpServer",
    "ServerAddress",
    "UnsafeAddress",
    "check_server_url",
]
