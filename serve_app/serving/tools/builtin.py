"""The runners of gpt-oss's own tools: ``browser`` (a request's ``web_search``) and ``python``
(``code_interpreter``), each a call through the MCP client (serving/tools/mcp/client.py:
streamable HTTP, or SSE for a URL ending in ``/sse``) to the tool server the operator names in
AppArgs (``tools.browser_server_url``, ``tools.python_server_url``), as vLLM's
``--tool-server`` does:
``to=browser.search`` is ``call_tool("search", <the model's JSON>)``, ``to=python`` is
``call_tool("python", {"code": <the model's code>})``; the server's text is what the model
reads next.

The browser is stateful (a page stack its cursors index): every call of one response carries
the response's id as ``x-session-id`` (what vLLM sends, and what the reference tool server,
serve_app/toolserver, keys its sessions by), so ``open(id=3)`` follows a link of the page an
earlier call of the same response opened.

Nothing here raises to the loop: a bad argument, an unreachable or slow server (past
``tools.mcp_call_timeout_s``), an error result or an output beyond ``tools.mcp_max_output_bytes``
is a `ToolResult` error the model reads, its item ``failed``. Calls to one server from this
ingress replica are bounded by ``tools.mcp_max_concurrent_calls``.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from typing import Any

from serve_app.config import ToolArgs
from serve_app.protocol import builtin_items
from serve_app.protocol.builtin_tools import CodeInterpreterTool, WebSearchTool
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.tools.contract import (
    ToolCall,
    ToolContext,
    ToolDescription,
    ToolResult,
    ToolRunners,
    ToolSession,
)
from serve_app.serving.tools.mcp.client import McpClient, McpServer

logger = logging.getLogger(__name__)

SESSION_HEADER = "x-session-id"
OUTPUTS_INCLUDE = "code_interpreter_call.outputs"
SOURCES_INCLUDE = "web_search_call.action.sources"
# A browsing display starts `[{cursor}] {title} ({url})` (serve_app/toolserver/browser.py, the
# gpt-oss package's reference browser): the page's cursor and URL.
_DISPLAY_HEAD = re.compile(r"^\[(?P<cursor>\d+)\] .*\((?P<url>[a-z][a-z0-9+.-]*:[^\s()]*)\)$")
# Pages whose URL a response's calls have seen, kept for this many responses at most.
_MAX_TRACKED = 1024


def tool_server_client(url: str, args: ToolArgs) -> McpClient:
    """The MCP client (serving/tools/mcp/client.py: its timeouts, response and output bounds,
    calls in flight per server) for the operator's tool server at ``url``, reached at the name
    the operator wrote (a cluster Service resolving to a private ClusterIP, a sidecar on
    loopback: `operator_entry`), whatever `mcp_allow` holds for requests' `mcp` tools, which
    this client never reaches (it calls ``url`` only)."""
    return McpClient(args.model_copy(update={"mcp_allow": []}), operator_urls=[url])


class BuiltinToolRunner:
    """Runs one kind of gpt-oss's tools (``browser`` or ``python``) on its tool server."""

    def __init__(self, kind: str, url: str, args: ToolArgs) -> None:
        self.kind = kind
        self.url = url
        self.client = tool_server_client(url, args)
        # Per response: the URL of each page (by cursor) its browser calls opened, so a `find`
        # item can say which page it searched.
        self._pages: OrderedDict[str, dict[int, str]] = OrderedDict()

    async def run(self, call: ToolCall, pages: dict[int, str] | None = None) -> ToolResult:
        """One call; ``pages``: the URLs of the pages the response's calls opened (its
        session's), else kept here by response id."""
        try:
            name, arguments = self._mcp_call(call)
        except ValueError as error:
            return ToolResult(error=str(error))
        headers = {SESSION_HEADER: call.response_id} if call.response_id else {}
        server = McpServer(self.url, headers, owner=call.owner)
        outcome = await self.client.call_tool(server, name, arguments)
        if outcome.error is not None:
            logger.info("%s call of %s failed: %s", self.kind, call.response_id, outcome.message)
        text = outcome.message
        data = self._data(call, arguments, text, dict(outcome.structured or {}), pages)
        if outcome.error is not None:
            return ToolResult(error=text or f"The {self.kind} call failed.", data=data)
        return ToolResult(output=text, data=data)

    def _mcp_call(self, call: ToolCall) -> tuple[str, dict[str, Any]]:
        """The MCP tool and arguments a harmony call names; ValueError: the model's text is
        not arguments (it reads why)."""
        if self.kind == builtin_items.PYTHON_KIND:
            return "python", {"code": call.arguments}
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ValueError(f"The arguments of browser.{call.spec.name} must be a JSON object.")
        return call.spec.name, arguments

    def _data(
        self,
        call: ToolCall,
        arguments: dict[str, Any],
        text: str,
        page: dict[str, Any],
        pages: dict[int, str] | None = None,
    ) -> dict[str, Any]:
        """The item's own fields (builtin_items.py): what the call did, as far as the request's
        ``include`` asks. ``page``: the result's structured content, where a tool server says
        what it showed (the reference server: ``cursor``, ``url``, and a search's ``sources``,
        its results' URLs); else the display's first line, ``[cursor] title (url)``."""
        include = set(call.request.include)
        if self.kind == builtin_items.PYTHON_KIND:
            return {builtin_items.LOGS: text} if OUTPUTS_INCLUDE in include else {}
        pages = self._tracked(call.response_id) if pages is None else pages
        data: dict[str, Any] = {}
        cursor, url = _shown_page(text, page)
        if call.spec.name == "open" and url:
            # Only opened pages: a find's results page is not a page find searches.
            if cursor is not None:
                pages[cursor] = url
            data[builtin_items.URL] = url
        elif call.spec.name == "search" and SOURCES_INCLUDE in include:
            sources = page.get("sources")
            if isinstance(sources, list) and all(isinstance(source, str) for source in sources):
                data[builtin_items.SOURCES] = sources
        elif call.spec.name == "find":
            cursor = arguments.get("cursor", -1)
            url = pages.get(cursor) if isinstance(cursor, int) and cursor >= 0 else None
            # Without a cursor, find searches the newest page: the last one with a URL.
            data[builtin_items.URL] = url or (pages[max(pages)] if pages else "")
        return data

    def _tracked(self, response_id: str) -> dict[int, str]:
        pages = self._pages.pop(response_id, None) or {}
        self._pages[response_id] = pages
        while len(self._pages) > _MAX_TRACKED:
            self._pages.popitem(last=False)
        return pages


def _shown_page(text: str, page: dict[str, Any]) -> tuple[int | None, str | None]:
    """The cursor and URL of the page a call showed: from its structured content, else from
    its display's first line."""
    cursor, url = page.get("cursor"), page.get("url")
    if isinstance(url, str) and url:
        return (cursor if isinstance(cursor, int) else None), url
    head = _DISPLAY_HEAD.match(text.split("\n", 1)[0])
    return (int(head["cursor"]), head["url"]) if head else (None, None)


class _BuiltinSession:
    """One response's calls of the browser (or python): the pages its calls opened."""

    def __init__(self, runner: BuiltinToolRunner) -> None:
        self._runner = runner
        self._pages: dict[int, str] = {}

    async def run(self, call: ToolCall) -> ToolResult:
        return await self._runner.run(call, self._pages)

    async def aclose(self) -> None:
        self._pages.clear()


class BuiltinToolServer:
    """gpt-oss's browser or python as a `ToolServer`: a request's ``web_search`` (the
    browser) or ``code_interpreter`` (python); described as gpt-oss was trained (harmony's own
    tool configs, from the request's tools: `ToolRegistry`), so it adds no spec; a session per
    response holds the pages its browser calls opened."""

    def __init__(self, kind: str, url: str, args: ToolArgs) -> None:
        self.runner = BuiltinToolRunner(kind, url, args)
        self.kinds = frozenset({kind})
        self._tool = WebSearchTool if kind == builtin_items.BROWSER_KIND else CodeInterpreterTool

    def has(self, request: ResponsesRequest) -> bool:
        return any(isinstance(tool, self._tool) for tool in request.tools)

    async def describe(self, context: ToolContext) -> ToolDescription:
        return ToolDescription()

    def session(self, owner: str | None, response_id: str) -> ToolSession:
        return _BuiltinSession(self.runner)


def register_builtin_runners(runners: ToolRunners, args: ToolArgs) -> list[McpClient]:
    """The servers of the tool servers the operator named (none: the door refuses the tools,
    serve_app.serving.admission.builtin); their MCP clients (whose sessions the service ends)."""
    clients = []
    for kind, url in (
        (builtin_items.BROWSER_KIND, args.browser_server_url),
        (builtin_items.PYTHON_KIND, args.python_server_url),
    ):
        if url:
            server = BuiltinToolServer(kind, url, args)
            runners.add_server(server)
            clients.append(server.runner.client)
    return clients
