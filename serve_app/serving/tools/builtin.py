"""The runners of gpt-oss's own tools: ``browser`` (a request's ``web_search``) and ``python``
(``code_interpreter``), each a call to the MCP tool server the operator names in AppArgs
(``tools.browser_server_url``, ``tools.python_server_url``), as vLLM's ``--tool-server`` does:
``to=browser.search`` is ``call_tool("search", <the model's JSON>)``, ``to=python`` is
``call_tool("python", {"code": <the model's code>})``; the server's text is what the model
reads next.

The browser is stateful (a page stack its cursors index): every call of one response carries
the response's id as ``x-session-id`` (what vLLM sends, and what the reference tool server,
serve_app/toolserver, keys its sessions by), so ``open(id=3)`` follows a link of the page an
earlier call of the same response opened.

Nothing here raises to the loop: a bad argument, an unreachable or slow server, a failed call
or an output beyond ``tools.mcp_max_output_bytes`` is a `ToolResult` error the model reads, its
item ``failed``. Calls to one server from this ingress replica are bounded by
``tools.mcp_max_concurrent_calls``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import OrderedDict
from typing import Any

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from serve_app.config import ToolArgs
from serve_app.protocol import builtin_items
from serve_app.serving.tools.contract import ToolCall, ToolResult, ToolRunners

logger = logging.getLogger(__name__)

SESSION_HEADER = "x-session-id"
SOURCES_INCLUDE = "web_search_call.action.sources"
OUTPUTS_INCLUDE = "code_interpreter_call.outputs"
# A browsing display starts `[{cursor}] {title} ({url})` (serve_app/toolserver/browser.py, the
# gpt-oss package's reference browser): the page's cursor and URL.
_DISPLAY_HEAD = re.compile(r"^\[(?P<cursor>\d+)\] .*\((?P<url>[a-z][a-z0-9+.-]*:[^\s()]*)\)$")
# Pages whose URL a response's calls have seen, kept for this many responses at most.
_MAX_TRACKED = 1024


class BuiltinToolRunner:
    """Runs one kind of gpt-oss's tools (``browser`` or ``python``) on its tool server."""

    def __init__(self, kind: str, url: str, args: ToolArgs) -> None:
        self.kind = kind
        self.url = url
        self._args = args
        self._slots = asyncio.Semaphore(args.mcp_max_concurrent_calls)
        # Per response: the URL of each page (by cursor) its browser calls displayed, so a
        # `find` item can say which page it searched.
        self._pages: OrderedDict[str, dict[int, str]] = OrderedDict()

    async def run(self, call: ToolCall) -> ToolResult:
        try:
            name, arguments = self._mcp_call(call)
        except ValueError as error:
            return ToolResult(error=str(error))
        try:
            async with self._slots:
                async with asyncio.timeout(self._args.mcp_call_timeout_s):
                    is_error, text, extra = await self._call(name, arguments, call.response_id)
        except TimeoutError:
            return ToolResult(
                error=f"The {self.kind} tool did not answer within "
                f"{self._args.mcp_call_timeout_s:g} s."
            )
        except Exception as error:  # any failure of the server or the link: the model reads it
            logger.info("%s call of %s failed: %r", self.kind, call.response_id, error)
            return ToolResult(error=f"The {self.kind} tool server could not be reached or failed.")
        if len(text.encode()) > self._args.mcp_max_output_bytes:
            return ToolResult(
                error=f"The {self.kind} tool's output is larger than "
                f"{self._args.mcp_max_output_bytes} bytes."
            )
        data = self._data(call, arguments, text, extra)
        if is_error:
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

    async def _call(
        self, name: str, arguments: dict[str, Any], session: str
    ) -> tuple[bool, str, dict[str, Any]]:
        """The call's ``isError``, its text, and its structured content (if any)."""
        timeout = httpx2.Timeout(
            self._args.mcp_call_timeout_s, connect=self._args.mcp_connect_timeout_s
        )
        headers = {SESSION_HEADER: session} if session else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
            streamable_http_client(
                self.url, http_client=http, max_sse_event_size=self._args.mcp_max_response_bytes
            ) as (read, write),
            ClientSession(read, write) as mcp,
        ):
            await mcp.initialize()
            result = await mcp.call_tool(name, arguments)
        text = "".join(getattr(block, "text", "") for block in result.content)
        structured = result.structured_content
        return bool(result.is_error), text, structured if isinstance(structured, dict) else {}

    def _data(
        self, call: ToolCall, arguments: dict[str, Any], text: str, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """The item's own fields (builtin_items.py): what the call did, as far as the request's
        ``include`` asks. A search's sources are the URLs its server gives in the result's
        structured content (``{"sources": [url, ...]}``); a display shows none."""
        include = set(call.request.include)
        if self.kind == builtin_items.PYTHON_KIND:
            return {builtin_items.LOGS: text} if OUTPUTS_INCLUDE in include else {}
        pages = self._tracked(call.response_id)
        data: dict[str, Any] = {}
        head = _DISPLAY_HEAD.match(text.split("\n", 1)[0])
        if call.spec.name == "open" and head:
            # Only opened pages: a find's results page is not a page find searches.
            pages[int(head["cursor"])] = head["url"]
            data[builtin_items.URL] = head["url"]
        elif call.spec.name == "find":
            cursor = arguments.get("cursor", -1)
            url = pages.get(cursor) if isinstance(cursor, int) and cursor >= 0 else None
            # Without a cursor, find searches the newest page: the last one with a URL.
            data[builtin_items.URL] = url or (pages[max(pages)] if pages else "")
        elif call.spec.name == "search" and SOURCES_INCLUDE in include:
            sources = extra.get("sources")
            if isinstance(sources, list) and all(isinstance(url, str) for url in sources):
                data[builtin_items.SOURCES] = sources
        return data

    def _tracked(self, response_id: str) -> dict[int, str]:
        pages = self._pages.pop(response_id, None) or {}
        self._pages[response_id] = pages
        while len(self._pages) > _MAX_TRACKED:
            self._pages.popitem(last=False)
        return pages


def register_builtin_runners(runners: ToolRunners, args: ToolArgs) -> None:
    """The runners of the tool servers the operator named (none: the door refuses the tools,
    serve_app.serving.admission.builtin)."""
    if args.browser_server_url:
        runners.register(
            builtin_items.BROWSER_KIND,
            BuiltinToolRunner(builtin_items.BROWSER_KIND, args.browser_server_url, args),
        )
    if args.python_server_url:
        runners.register(
            builtin_items.PYTHON_KIND,
            BuiltinToolRunner(builtin_items.PYTHON_KIND, args.python_server_url, args),
        )
