"""The reference tool server: one MCP server (the `mcp` SDK's `MCPServer`) with gpt-oss's
`browser` tools (`search`, `open`, `find`) and its `python` tool, over streamable HTTP at `/mcp`
and SSE at `/sse`.

The tool names and argument shapes are gpt-oss's (openai_harmony's `ToolNamespaceConfig.browser()`
describes them; the `gpt-oss` package's MCP servers and vLLM's `--tool-server` use the same):
a harmony call `to=browser.search` is `call_tool("search", {...})`, `to=python` is
`call_tool("python", {"code": ...})`. A tool's output is its text; a call the browser cannot do
(an unknown link id, a cursor out of range) is an error result (`isError`) whose text says why,
which the model reads. The browser keeps one page stack per session, keyed by the request's
`x-session-id` header (what vLLM sends), else its MCP session.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from openai_harmony import ToolNamespaceConfig
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from serve_app.toolserver.browser import Browser, BrowserError, Display
from serve_app.toolserver.documents import DEFAULT_BASE_URL, DocumentFolder
from serve_app.toolserver.python_runner import Isolation, PythonLimits, PythonRunner

ToolName = Literal["browser", "python"]


@dataclass(frozen=True)
class ToolServerConfig:
    tools: tuple[ToolName, ...] = ("browser", "python")
    docs: Path | None = None
    base_url: str = DEFAULT_BASE_URL
    python_limits: PythonLimits = field(default_factory=PythonLimits)
    python_isolation: Isolation = "hook"
    python_executable: str | None = None


def server_name(tools: tuple[ToolName, ...]) -> str:
    """One tool: its namespace, as vLLM reads a tool server's name; both: the pair's name."""
    return tools[0] if len(tools) == 1 else "gpt-oss-tools"


def python_description(limits: PythonLimits) -> str:
    return (
        "Use this tool to execute STATELESS Python code in your chain of thought. The code will "
        "not be shown to the user. This tool should be used for internal reasoning, but not for "
        "code that is intended to be visible to the user (e.g. when creating plots, tables, or "
        "files).\nWhen you send a message containing python code to python, it will be executed "
        "in a new process, and what it prints (stdout and stderr) will be returned to you. You "
        "have to use print statements to access the output. It has no internet access, and "
        f"stops after {limits.wall_seconds:g} seconds.\n\nIMPORTANT: Your python environment is "
        "not shared between calls. You will have to pass your entire code each time."
    )


def browser_instructions() -> str:
    """harmony's browser description, its sources line naming the local documents."""
    lines = ToolNamespaceConfig.browser().description.splitlines()
    return "\n".join([line for line in lines if not line.startswith("sources=")] + ["sources=docs"])


def session_key(ctx: Context) -> str:
    headers = ctx.headers or {}
    if key := headers.get("x-session-id") or headers.get("mcp-session-id"):
        return key
    return f"connection-{id(ctx.request_context.session)}"


def _answer(call: Callable[[], Display]) -> CallToolResult:
    """The browser's display (its text; its cursor, URL, title and a search's sources as
    structured content), or its refusal as an error result the model reads."""
    try:
        display = call()
    except BrowserError as error:
        raise ToolError(str(error)) from None
    return CallToolResult(
        content=[TextContent(type="text", text=display.text)],
        structured_content=display.fields(),
    )


def _add_browser(server: MCPServer, browser: Browser) -> None:
    descriptions = {tool.name: tool.description for tool in ToolNamespaceConfig.browser().tools}

    async def search(
        ctx: Context, query: str, topn: int = 10, source: str | None = None
    ) -> CallToolResult:
        return _answer(lambda: browser.search(session_key(ctx), query, topn))

    async def open(  # the tool's name
        ctx: Context,
        id: int | str = -1,  # gpt-oss's argument name
        cursor: int = -1,
        loc: int = -1,
        num_lines: int = -1,
        view_source: bool = False,
        source: str | None = None,
    ) -> CallToolResult:
        key = session_key(ctx)
        return _answer(lambda: browser.open(key, id, cursor, loc, num_lines, view_source))

    async def find(ctx: Context, pattern: str, cursor: int = -1) -> CallToolResult:
        return _answer(lambda: browser.find(session_key(ctx), pattern, cursor))

    for fn in (search, open, find):
        name = fn.__name__
        server.add_tool(fn, name=name, description=descriptions[name], structured_output=False)


def _add_python(server: MCPServer, runner: PythonRunner) -> None:
    async def python(code: str) -> str:
        return await runner.run(code)

    server.add_tool(
        python,
        name="python",
        description=python_description(runner.limits),
        structured_output=False,
    )


def build_server(config: ToolServerConfig) -> MCPServer:
    browser = runner = None
    instructions = []
    if "browser" in config.tools:
        if config.docs is None:
            raise ValueError("the browser tool needs a document folder (--docs DIR)")
        browser = Browser(DocumentFolder(config.docs, config.base_url))
        instructions.append(browser_instructions())
    if "python" in config.tools:
        executable = config.python_executable or sys.executable
        runner = PythonRunner(config.python_limits, config.python_isolation, executable)
        instructions.append(python_description(config.python_limits))
    server = MCPServer(
        server_name(config.tools), instructions="\n\n".join(instructions), log_level="WARNING"
    )
    if browser is not None:
        _add_browser(server, browser)
    if runner is not None:
        _add_python(server, runner)
    return server


def build_app(config: ToolServerConfig, host: str = "127.0.0.1") -> Starlette:
    """The HTTP app: streamable HTTP at /mcp, SSE at /sse (+ /messages/), GET /health."""
    server = build_server(config)
    app = server.streamable_http_app(host=host)
    app.router.routes.extend(server.sse_app(host=host).routes)
    app.router.routes.append(Route("/health", _health, methods=["GET"]))
    return app


async def _health(_: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")
