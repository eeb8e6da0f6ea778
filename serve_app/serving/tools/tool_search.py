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
from serve_app.protocol.tool_items import ToolResult
from serve_app.protocol.tool_search import ToolSearchOutputItem
from serve_app.serving.tools.contract import ToolCall, ToolRunners


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


def register(runners: ToolRunners) -> None:
    """Both runners, unless the operator registered their own."""
    for kind, runner in (
        (tool_search_items.SERVER_KIND, ServerToolSearch()),
        (tool_search_items.CLIENT_KIND, ClientToolSearch()),
    ):
        if runners.runner(kind) is None:
            runners.register(kind, runner)
