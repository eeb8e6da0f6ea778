"""The MCP client the server runs `mcp` tools with: list a server's tools, call one, with the
official `mcp` SDK (`ClientSession` over its streamable HTTP or SSE transport).

Sessions last (sessions.py): one per (owner, server URL, headers), opened at its first
operation (resolve and check the address, connect, initialize) and reused by every operation
of that key within ``mcp_session_ttl_s`` of the last one: a response's listing and calls, and
its owner's next responses. Nothing of one owner's session is used for another's (the owner is
in the key), and a broken session breaks the operations on it and is ended, never reused. A
session the server has forgotten (it answers 404 to its id: the request was not run; a server
restarted at the same URL) is replaced once, for that operation. Every bound of `ToolArgs`
applies: the connect, list and call timeouts, the bytes of a response (an SSE event) and of a
result, the tools of a listing, the calls in flight to one server per owner and credentials. A
failure of any kind is a value (`ListOutcome`, `CallOutcome` with ``error``) whose message the
model and the client can read; only the caller's own cancellation leaves as an exception.

Headers (``authorization`` too) go to their server only, in the HTTP requests of its session:
never into a log line, an error message or a repr.

Transport: a URL whose path ends in ``/sse`` is spoken to with the SSE transport (the
convention of SSE servers and of the SDK's own ``sse_app``), any other with streamable HTTP.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from openai.types.responses.mcp_tool_call_error import (
    HTTPError,
    McpProtocolError,
    McpToolCallError,
    McpToolExecutionError,
)
from openai.types.responses.response_output_item import McpListToolsTool

from serve_app.config import ToolArgs
from serve_app.protocol.errors import InvalidRequest
from serve_app.serving.tools.mcp.policy import (
    IPAddress,
    ServerAddress,
    UnsafeAddress,
    check_server_url,
    operator_entry,
    parse_server_url,
    resolve_checked,
)
from serve_app.serving.tools.mcp.servers import McpServer, Slots
from serve_app.serving.tools.mcp.sessions import McpSessions, SessionBroken
from serve_app.serving.tools.mcp.transport import Guard, pinned_client

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
CLIENT_INFO = mcp_types.Implementation(name="serve_app", version="1")
# Pages of a listing followed at most (each page's tools count against mcp_max_tools too).
MAX_LIST_PAGES = 100


@dataclass(frozen=True)
class ListOutcome:
    """A server's tools, or why it could not list them."""

    tools: list[McpListToolsTool] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class CallOutcome:
    """A call's output (its text content, as the model reads it), or its error as an
    ``mcp_call`` item carries it."""

    output: str | None = None
    error: McpToolCallError | None = None
    # The result's structured content, beside its text (e.g. a browser page's URL).
    structured: Mapping[str, Any] | None = None

    @property
    def message(self) -> str:
        """What the model reads: the output, or what went wrong."""
        if self.error is None:
            return self.output or ""
        if isinstance(self.error, McpToolExecutionError):
            return _content_text(self.error.content)
        return self.error.message


class _Failed(Exception):
    """An operation's failure, already described (a value once it leaves the client)."""

    def __init__(self, error: McpToolCallError) -> None:
        super().__init__(getattr(error, "message", "failed"))
        self.error = error


def _protocol_error(code: int, message: str) -> McpProtocolError:
    return McpProtocolError(type="mcp_protocol_error", code=code, message=message)


class McpClient:
    """The MCP client of one ingress replica: the allowlist and bounds of `ToolArgs` (its
    environment override applied), and the per-server bound on calls in flight.

    ``operator_urls``: servers the operator configured itself (a tool server's URL), reached
    at the names it wrote whatever they resolve to but link-local and metadata addresses
    (`operator_entry`); any other URL is a request's, under `mcp_allow`."""

    def __init__(self, args: ToolArgs | None = None, *, operator_urls: Sequence[str] = ()) -> None:
        self.args = (args or ToolArgs()).resolved()
        self._operator = [operator_entry(url) for url in operator_urls]
        self._slots = Slots(self.args.mcp_max_concurrent_calls)
        self._sessions = McpSessions(
            self.args.mcp_session_ttl_s, self.args.mcp_max_sessions, self.args.mcp_connect_timeout_s
        )
        # Each session's last listing, and when (`listed_before`): kept as long as sessions.
        self._listed: OrderedDict[str, tuple[float, ListOutcome]] = OrderedDict()

    def listed_before(self, server: McpServer) -> ListOutcome | None:
        """What ``server``'s session listed last, within the session TTL (None: nothing):
        a guess at its next listing, never a listing itself."""
        found = self._listed.get(server.session_key)
        if found is None or time.monotonic() - found[0] > self.args.mcp_session_ttl_s:
            return None
        return found[1]

    def _remember(self, server: McpServer, listing: ListOutcome) -> None:
        self._listed[server.session_key] = (time.monotonic(), listing)
        self._listed.move_to_end(server.session_key)
        while len(self._listed) > self.args.mcp_max_sessions:
            self._listed.popitem(last=False)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    def close(self) -> None:
        """End every session (the replica is going away); `aclose` waits for them."""
        self._sessions.close()

    async def aclose(self) -> None:
        await self._sessions.aclose()

    def check_server_url(self, url: str, param: str) -> ServerAddress:
        """The request path's check (a 400 naming ``param``), before any connection."""
        return check_server_url(url, param, self.args.mcp_allow)

    async def reach(self, url: str) -> tuple[ServerAddress, IPAddress]:
        """Where ``url``'s requests go: its parts and the address its name resolved to, every
        address checked against the entry covering it (the operator's own, else a request's
        under `mcp_allow`: checked again, as a stored request may outlive a change of it).
        Raises `InvalidRequest` (no entry covers it) or `UnsafeAddress`."""
        address = parse_server_url(url)
        entry = next((own for own in self._operator if own.covers(address)), None)
        if entry is None:
            entry = check_server_url(url, "server_url", self.args.mcp_allow)
        with anyio.fail_after(self.args.mcp_connect_timeout_s):
            return address, await resolve_checked(address, entry)

    def calls_in_flight(self, server: McpServer) -> int:
        return self._slots.active(server.key)

    async def list_tools(self, server: McpServer) -> ListOutcome:
        """The server's tools (every page), within ``mcp_list_timeout_s``."""

        async def listing(session: ClientSession) -> list[McpListToolsTool]:
            return await self._list(session)

        try:
            tools = await self._operate(server, self.args.mcp_list_timeout_s, listing)
        except _Failed as failure:
            return ListOutcome(error=CallOutcome(error=failure.error).message)
        listed = ListOutcome(tools=tools)
        self._remember(server, listed)
        return listed

    async def call_tool(
        self, server: McpServer, name: str, arguments: str | Mapping[str, Any]
    ) -> CallOutcome:
        """Call ``name`` with ``arguments`` (a JSON object, or its text as the model wrote it)
        within ``mcp_call_timeout_s``, waiting for a free slot of the server included."""
        try:
            parsed = _arguments(arguments)
        except ValueError as error:
            return CallOutcome(error=_protocol_error(mcp_types.INVALID_PARAMS, str(error)))

        async def calling(session: ClientSession) -> CallOutcome:
            request = mcp_types.CallToolRequest(
                params=mcp_types.CallToolRequestParams(name=name, arguments=parsed)
            )
            result = await session.send_request(request, mcp_types.CallToolResult)
            return self._outcome(result, server)

        try:
            return await self._operate(server, self.args.mcp_call_timeout_s, calling, slot=True)
        except _Failed as failure:
            return CallOutcome(error=failure.error)

    async def _list(self, session: ClientSession) -> list[McpListToolsTool]:
        tools: list[McpListToolsTool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools.extend(_listed(tool) for tool in page.tools)
            if len(tools) > self.args.mcp_max_tools:
                raise _Failed(
                    _protocol_error(
                        mcp_types.INTERNAL_ERROR,
                        f"the MCP server lists more than {self.args.mcp_max_tools} tools, "
                        "more than this server takes",
                    )
                )
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise _Failed(
            _protocol_error(mcp_types.INTERNAL_ERROR, "the MCP server's tool list never ends")
        )

    def _outcome(self, result: mcp_types.CallToolResult, server: McpServer) -> CallOutcome:
        blocks = [
            block.model_dump(by_alias=True, exclude_none=True, mode="json")
            for block in result.content
        ]
        text = _content_text(blocks)
        if not blocks and result.structured_content is not None:
            text = json.dumps(result.structured_content)
        # An error is text the model reads too: held to the same bound (3 MB passed 1 KiB).
        size = len(text.encode())
        if size > self.args.mcp_max_output_bytes:
            message = (
                f"the tool's {'error' if result.is_error else 'output'} is {size} bytes, more "
                f"than the {self.args.mcp_max_output_bytes} this server passes on"
            )
            return CallOutcome(error=_protocol_error(mcp_types.INTERNAL_ERROR, message))
        if result.is_error:  # an error the server wrote: it may echo what it was sent
            for block in blocks:
                if isinstance(block.get("text"), str):
                    block["text"] = server.redact(block["text"])
            return CallOutcome(
                error=McpToolExecutionError(type="mcp_tool_execution_error", content=blocks)
            )
        structured = result.structured_content
        return CallOutcome(
            output=text, structured=structured if isinstance(structured, dict) else None
        )

    async def _operate(
        self,
        server: McpServer,
        timeout_s: float,
        body: Callable[[ClientSession], Awaitable[_T]],
        *,
        slot: bool = False,
    ) -> _T:
        """``body`` on ``server``'s session (opened, or open already), within ``timeout_s`` in
        all; its failures raised as `_Failed` (described, redacted), the caller's cancellation
        as is. A session the server no longer knows is replaced once: its 404 says the request
        was not run."""
        guards: list[Guard] = []  # the sessions' guards: what broke them, if anything
        with anyio.CancelScope(deadline=anyio.current_time() + timeout_s) as scope:
            async with contextlib.AsyncExitStack() as stack:
                if slot:
                    await stack.enter_async_context(self._slots.hold(server.key))
                try:
                    return await self._on_session(server, timeout_s, body, scope, guards)
                except _Forgotten:
                    self._sessions.discard(server.session_key)
                    return await self._on_session(server, timeout_s, body, scope, guards)
        # Cancelled: the session broke under the operation (its guard says why), or timed out.
        failure = next((guard.failure for guard in guards if guard.failure), None)
        if failure is not None:
            raise _Failed(_protocol_error(mcp_types.INTERNAL_ERROR, failure))
        raise _Failed(
            _protocol_error(
                mcp_types.REQUEST_TIMEOUT, f"the MCP server did not answer within {timeout_s:g}s"
            )
        )

    async def _on_session(
        self,
        server: McpServer,
        timeout_s: float,
        body: Callable[[ClientSession], Awaitable[_T]],
        scope: anyio.CancelScope,
        guards: list[Guard],
    ) -> _T:
        """``body`` on the session of ``server``'s key; ``guards`` gets the session's guard."""

        async def opener(stack: contextlib.AsyncExitStack, guard: Guard) -> ClientSession:
            return await self._open(stack, server, guard, timeout_s)

        guard = Guard()
        try:
            async with self._sessions.use(server.session_key, opener, scope) as opened:
                session, guard, reused = opened
                guards.append(guard)
                try:
                    return await body(session)
                except MCPError as error:
                    if reused and _forgotten(error, guard):
                        raise _Forgotten() from None
                    raise
        except (_Failed, _Forgotten):
            raise
        except SessionBroken as broken:
            guards.append(broken.guard)
            cause = broken.cause
            if isinstance(cause, _Failed):
                raise cause from None
            raise _Failed(_describe(cause or broken, broken.guard, server)) from None
        except Exception as error:  # every failure is the model's to read
            raise _Failed(_describe(error, guard, server)) from None

    async def _open(
        self, stack: contextlib.AsyncExitStack, server: McpServer, guard: Guard, timeout_s: float
    ) -> ClientSession:
        """A session with ``server``, initialized: its URL and address checked (`reach`) and
        pinned."""
        args = self.args
        try:
            address, ip = await self.reach(server.url)
        except (InvalidRequest, ValueError) as error:
            raise _Failed(_protocol_error(mcp_types.INVALID_REQUEST, str(error))) from None

        def http_client(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            return pinned_client(
                address,
                ip,
                server.headers,
                connect_timeout_s=args.mcp_connect_timeout_s,
                read_timeout_s=max(args.mcp_call_timeout_s, args.mcp_list_timeout_s),
                max_response_bytes=args.mcp_max_response_bytes,
                guard=guard,
            )

        if server.transport == "sse":
            streams = sse_client(
                server.url,
                timeout=args.mcp_connect_timeout_s,
                sse_read_timeout=None,  # the session's stream stays open between operations
                httpx_client_factory=http_client,
            )
        else:
            client = await stack.enter_async_context(http_client())
            streams = streamable_http_client(
                server.url, http_client=client, max_sse_event_size=args.mcp_max_response_bytes
            )
        read, write = await stack.enter_async_context(streams)
        session = await stack.enter_async_context(
            ClientSession(read, write, client_info=CLIENT_INFO)
        )
        with anyio.fail_after(args.mcp_connect_timeout_s):
            await session.initialize()
        return session


class _Forgotten(Exception):
    """A reused session the server no longer knows (404: the request was not run)."""


def _forgotten(error: MCPError, guard: Guard) -> bool:
    """Whether the server no longer knows the session: it answers 404 (the transport's rule),
    whatever its error says (the Python SDK's client says ``Session terminated``; servers say
    ``Session not found``, with -32600 or -32001)."""
    return guard.http_status == 404 or (
        error.code == mcp_types.INVALID_REQUEST and error.message == "Session terminated"
    )


def _arguments(arguments: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise ValueError(f"the arguments are not valid JSON ({error.msg})") from None
    if not isinstance(arguments, Mapping):
        raise ValueError("the arguments are not a JSON object")
    return dict(arguments)


def _listed(tool: mcp_types.Tool) -> McpListToolsTool:
    annotations = (
        tool.annotations.model_dump(by_alias=True, exclude_none=True, mode="json")
        if tool.annotations
        else None
    )
    return McpListToolsTool(
        name=tool.name,
        description=tool.description,
        input_schema=tool.input_schema,
        annotations=annotations,
    )


def _content_text(blocks: object) -> str:
    """The text of content blocks: text blocks as they are, any other block as its JSON."""
    if not isinstance(blocks, list):
        return json.dumps(blocks)
    parts = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            parts.append(json.dumps(block))
    return "\n".join(parts)


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def _describe(error: Exception, guard: Guard, server: McpServer) -> McpToolCallError:
    """The failure as an ``mcp_call`` error: what the transport guard saw first, else the
    most telling exception of the group anyio may have wrapped it in. Redacted."""
    if guard.failure is not None:
        return _protocol_error(mcp_types.INTERNAL_ERROR, guard.failure)
    leaves = list(_leaves(error))
    described = next((e for e in leaves if isinstance(e, _Failed)), None)
    if described is not None:  # ours, wrapped in a group by a task group closing
        return described.error
    leaf = next(
        (e for e in leaves if not isinstance(e, anyio.get_cancelled_exc_class())), leaves[0]
    )
    if isinstance(leaf, httpx2.HTTPStatusError):
        status = leaf.response.status_code
        return HTTPError(
            type="http_error", code=status, message=f"the MCP server answered HTTP {status}"
        )
    if isinstance(leaf, MCPError) and guard.http_status is not None:
        status = guard.http_status
        return HTTPError(
            type="http_error", code=status, message=f"the MCP server answered HTTP {status}"
        )
    if isinstance(leaf, MCPError):
        return _protocol_error(leaf.code, server.redact(leaf.message))
    if isinstance(leaf, TimeoutError | httpx2.TimeoutException):
        return _protocol_error(mcp_types.REQUEST_TIMEOUT, "the MCP server did not answer in time")
    if isinstance(leaf, httpx2.SSEError):
        detail = server.redact(str(leaf))
        return _protocol_error(
            mcp_types.INTERNAL_ERROR, f"the MCP server's event stream was refused ({detail})"
        )
    if isinstance(leaf, UnsafeAddress):
        return _protocol_error(mcp_types.CONNECTION_CLOSED, f"not connecting: {leaf}")
    if isinstance(leaf, httpx2.TransportError | OSError):
        detail = server.redact(str(leaf)) or type(leaf).__name__
        return _protocol_error(
            mcp_types.CONNECTION_CLOSED, f"could not reach the MCP server ({detail})"
        )
    logger.info("MCP operation failed: %s", type(leaf).__name__)
    return _protocol_error(
        mcp_types.INTERNAL_ERROR,
        server.redact(f"the MCP operation failed ({type(leaf).__name__}: {leaf})"),
    )
