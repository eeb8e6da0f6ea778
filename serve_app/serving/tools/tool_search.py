"""The runners of ``tool_search``: the server's search (execution ``server``, OpenAI's default)
and the client's (``client``: the call ends the response; the client's ``tool_search_output``
answers it in its next request).

The server's search ranks the request's deferred tools (serve_app.protocol.tool_search.search)
and answers the model with their definitions, the text a later turn renders for the
``tool_search_output`` item it also writes (serve_app.protocol.tool_search_items), so the
tools found are shown from there on, in this response and the ones that continue it.
"""

from __future__ import annotations

import asyncio

from serve_app.harmony.render import search_output_text
from serve_app.protocol import tool_search, tool_search_items
from serve_app.protocol.request_tools import ToolSearchTool
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.tool_items import ToolResult
from serve_app.protocol.tool_search import ToolSearchOutputItem
from serve_app.serving.tools.contract import (
    ToolCall,
    ToolContext,
    ToolDescription,
    ToolRunners,
    ToolSession,
)


class ServerToolSearch:
    """Searches the request's deferred tools; never fails (nothing found is an answer too).
    Off the event loop: 500 deferred tools take ~30 ms of CPU a search
    (loadtests/bench_tool_search.py)."""

    async def run(self, call: ToolCall) -> ToolResult:
        return await asyncio.to_thread(_answer, call)


def _answer(call: ToolCall) -> ToolResult:
    found = tool_search.search(call.request.tools, call.arguments)
    item = ToolSearchOutputItem.model_validate({"type": "tool_search_output", "tools": found})
    return ToolResult(output=search_output_text(item), data={"tools": found})


class ClientToolSearch:
    """The client searches: the response stops at the call, for the client's answer."""

    async def run(self, call: ToolCall) -> ToolResult:
        return ToolResult(awaits_client=True)


class _SearchSession:
    def __init__(self) -> None:
        self._server, self._client = ServerToolSearch(), ClientToolSearch()

    async def run(self, call: ToolCall) -> ToolResult:
        if call.spec.kind == tool_search_items.SERVER_KIND:
            return await self._server.run(call)
        return await self._client.run(call)

    async def aclose(self) -> None:
        return None


class ToolSearchServer:
    """``tool_search`` as a `ToolServer`: a request's ``tool_search`` tool, shown as the
    request defines it (`ToolRegistry`: what it can load, never their parameters), so it adds
    no spec; its calls searched here (execution ``server``) or left to the client."""

    kinds = frozenset({tool_search_items.SERVER_KIND, tool_search_items.CLIENT_KIND})

    def has(self, request: ResponsesRequest) -> bool:
        return any(isinstance(tool, ToolSearchTool) for tool in request.tools)

    async def describe(self, context: ToolContext) -> ToolDescription:
        return ToolDescription()

    def session(self, owner: str | None, response_id: str) -> ToolSession:
        return _SearchSession()


def register(runners: ToolRunners) -> None:
    """The tool search's server, unless the operator registered their own runners."""
    if all(runners.server(kind) is None for kind in ToolSearchServer.kinds):
        runners.add_server(ToolSearchServer())
