"""The tool loop's contract: what a tool the server runs gives the loop, and what it gets.

Every kind of tool the server runs (``ToolSpec.kind``: ``"mcp"``, ``"browser"``, ``"python"``,
``"tool_search"``...) comes in through one seam, a `ToolServer` (as vLLM's ``ToolServer``:
``has_tool``, ``get_tool_description``, ``new_session``):

- `ToolServer.has`: whether a request names tools of it;
- `ToolServer.describe`: what the model is shown of them beyond what the request's own tools
  say (an MCP server's listed tools), and the work to do before the model runs (`ToolStage`:
  an MCP server listed, approved calls run) once the response exists; asked once per
  response, after the door, whose tool registry (`ToolRegistry`, built once there) it extends;
- `ToolServer.session`: one per (server, response), which runs that response's calls of its
  kinds and is closed at the response's end (what its calls share: the browser's pages, the
  owner's MCP session).

Its items and events: a `ToolItemBuilder` registered with `register_tool_items` (in
serve_app/protocol/, beside its item types); the translator opens the kind's item when the
model's header names one of its tools, streams the arguments as the model writes them, and at
``<|call|>`` leaves it open, pending.

The loop (loop.py) takes a completion's pending calls in the model's order, runs them
concurrently (each `ToolSession.run` in a task of the response's `CancelScope`: a cancelled,
disconnected or steered response cancels them, as asyncio cancellation), writes each kind's
running and done events, closes the items in the model's order, appends each output as the
tool's harmony message (author: the recipient; channel commentary) and streams the model's
continuation with the same translator (same session id: the same engine replica, its cached
prefix). It ends at an answer, a client-run call, a call whose result `awaits_client` (an
approval request), ``max_tool_calls``, ``max_output_tokens`` or `ToolRunners.max_rounds`.

A runner never needs to raise: a `ToolResult` with ``error`` is a failed call item the model
reads. If one raises anyway, the loop logs it and makes it that failed item (never a 500).
Names here are stable: add, do not rename (`ToolRunner` and `ToolProvider`, the seams before
`ToolServer`, are kept as adapters onto it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from openai.types.responses import ResponseStreamEvent

from serve_app.harmony.tools import ToolSpec
from serve_app.protocol.requests import InputItem, ResponsesRequest
from serve_app.protocol.tool_items import (
    ToolItemBuilder,
    ToolResult,
    register_tool_items,
    server_run_kinds,
    tool_items,
)
from serve_app.serving.tools.mcp_trust import TrustedMcp

__all__ = [
    "DEFAULT_MAX_ROUNDS",
    "CancelScope",
    "ProviderServer",
    "RunnerServer",
    "ToolCall",
    "ToolContext",
    "ToolDescription",
    "ToolItemBuilder",
    "ToolProvider",
    "ToolResult",
    "ToolRunner",
    "ToolRunners",
    "ToolServer",
    "ToolSession",
    "ToolStage",
    "register_tool_items",
    "server_run_kinds",
    "tool_items",
]

# Model completions one response may make, its first included: a defensive bound (a model
# calling tools in a loop), beyond OpenAI's own ``max_tool_calls``.
DEFAULT_MAX_ROUNDS = 32

_T = TypeVar("_T")


class CancelScope:
    """The response's tool calls, cancelled together: the response was cancelled, its client
    went away, or it was steered. `cancel` cancels every task the scope `spawn`ed (a runner
    sees `asyncio.CancelledError` at its next await and should let it through, after closing
    what it opened: a subprocess, a connection)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cancelled = asyncio.Event()
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def spawn(self, coroutine: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
        """Run ``coroutine`` as a task of this scope (cancelled at once if the scope is)."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.cancelled:
            task.cancel()
        return task

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel every running task of the scope, and any spawned later."""
        if not self.cancelled:
            self.reason = reason
            self._cancelled.set()
        for task in list(self._tasks):
            task.cancel()

    async def wait(self) -> None:
        """Return once the scope is cancelled (for a runner that watches it beside its work)."""
        await self._cancelled.wait()

    @property
    def running(self) -> int:
        """Tasks of the scope not done yet."""
        return len(self._tasks)


@dataclass(frozen=True)
class ToolCall:
    """One call the model made of a tool the server runs, as its runner gets it."""

    # The tool (its kind names the runner; its namespace and name what the model called).
    spec: ToolSpec
    # The arguments as the model wrote them (JSON for a tool with parameters; a freeform
    # tool's raw input). Not validated: the runner checks them and answers a bad one with a
    # `ToolResult` error the model reads.
    arguments: str
    # Who made the request (a digest of their API key; None when the API is open).
    owner: str | None
    # The request the response answers (the tool's definition in ``tools``: a server's URL...).
    request: ResponsesRequest
    # The call's output item (``item_id``) and call id, as the client sees them.
    item_id: str
    call_id: str
    # The response's calls, cancelled together.
    scope: CancelScope
    # The response this call belongs to (for logs).
    response_id: str = ""


class ToolRunner(Protocol):
    """Runs the calls of one tool kind (a `ToolServer` whose session is the runner itself:
    `ToolRunners.register`)."""

    async def run(self, call: ToolCall) -> ToolResult: ...


class ToolProvider(Protocol):
    """Specs a request's tools add that the request alone cannot say: a `ToolServer` that only
    describes (`ToolRunners.add_provider`). An `APIError` it raises is the client's answer (a
    400 naming the tool); any other failure is its own to turn into specs or none."""

    async def specs(self, request: ResponsesRequest, owner: str | None) -> Sequence[ToolSpec]: ...


@dataclass(frozen=True)
class ToolContext:
    """What a server describes its tools for: the admitted request, its context (history and
    input), who asks, what the door found this server issued among the context's items (the
    MCP listings and approval requests), and whether a response is to be generated (a token
    count describes what it can without a server's state)."""

    request: ResponsesRequest
    items: Sequence[InputItem]
    owner: str | None
    trusted: TrustedMcp
    generating: bool = True


class ToolStage(Protocol):
    """A server's work before the model runs, once the response exists (the event loop's
    `Turn.tools_first`): its events as each step starts and ends; then what the model is shown
    after it (`specs`) and reads after the request's input (`rendered_items`)."""

    def __bool__(self) -> bool:
        """Whether there is any work."""
        ...

    def run(self, turn: Any) -> AsyncIterator[list[ResponseStreamEvent]]: ...

    def specs(self) -> Sequence[ToolSpec]:
        """The tools shown once it ran (before: `ToolDescription.specs`)."""
        ...

    def rendered_items(self) -> Sequence[InputItem]: ...

    def changed_prompt(self) -> bool:
        """Whether the prompt rendered before it no longer shows what it did."""
        ...


@dataclass(frozen=True)
class ToolDescription:
    """A server's part of a response: the specs it adds (rendered with the request's own, in
    the servers' order), and its stage (None: nothing to do before the model)."""

    specs: Sequence[ToolSpec] = ()
    stage: ToolStage | None = None


class ToolSession(Protocol):
    """One response's calls of one server's kinds."""

    async def run(self, call: ToolCall) -> ToolResult: ...

    async def aclose(self) -> None:
        """The response ended: let go of what its calls shared."""
        ...


class ToolServer(Protocol):
    """One seam for every kind of tool the server runs (module docstring)."""

    # The `ToolSpec.kind`s whose calls its sessions run.
    kinds: frozenset[str]

    def has(self, request: ResponsesRequest) -> bool: ...

    async def describe(self, context: ToolContext) -> ToolDescription: ...

    def session(self, owner: str | None, response_id: str) -> ToolSession: ...


class _RunnerSession:
    def __init__(self, runner: ToolRunner) -> None:
        self._runner = runner

    async def run(self, call: ToolCall) -> ToolResult:
        return await self._runner.run(call)

    async def aclose(self) -> None:
        return None


@dataclass(frozen=True)
class RunnerServer:
    """A `ToolRunner` as a `ToolServer`: runs ``kind``'s calls, describes nothing (its specs
    are the request's own tools')."""

    kind: str
    runner: ToolRunner

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset({self.kind})

    def has(self, request: ResponsesRequest) -> bool:
        return False

    async def describe(self, context: ToolContext) -> ToolDescription:
        return ToolDescription()

    def session(self, owner: str | None, response_id: str) -> ToolSession:
        return _RunnerSession(self.runner)


@dataclass(frozen=True)
class ProviderServer:
    """A `ToolProvider` as a `ToolServer`: describes its specs for every request, runs none."""

    provider: ToolProvider
    kinds: frozenset[str] = frozenset()

    def has(self, request: ResponsesRequest) -> bool:
        return True

    async def describe(self, context: ToolContext) -> ToolDescription:
        return ToolDescription(await self.provider.specs(context.request, context.owner))

    def session(self, owner: str | None, response_id: str) -> ToolSession:
        raise LookupError("a tool provider runs no calls")


class ToolRunners:
    """The tool servers the service is built with, and the bound on a response's rounds. A
    kind's calls run in the session of the server registered last for it."""

    def __init__(
        self,
        runners: Mapping[str, ToolRunner] | None = None,
        *,
        providers: Sequence[ToolProvider] = (),
        servers: Sequence[ToolServer] = (),
        max_rounds: int = DEFAULT_MAX_ROUNDS,
    ) -> None:
        self.servers: list[ToolServer] = []
        self._by_kind: dict[str, ToolServer] = {}
        self.max_rounds = max_rounds
        for kind, runner in (runners or {}).items():
            self.register(kind, runner)
        for provider in providers:
            self.add_provider(provider)
        for server in servers:
            self.add_server(server)

    def add_server(self, server: ToolServer) -> None:
        """Describe ``server``'s tools and run its kinds' calls (their items:
        `register_tool_items`)."""
        self.servers.append(server)
        for kind in server.kinds:
            self._by_kind[kind] = server

    def register(self, kind: str, runner: ToolRunner) -> None:
        """Run ``kind``'s calls with ``runner``."""
        self.add_server(RunnerServer(kind, runner))

    def add_provider(self, provider: ToolProvider) -> None:
        self.add_server(ProviderServer(provider))

    def server(self, kind: str) -> ToolServer | None:
        return self._by_kind.get(kind)

    def runner(self, kind: str) -> ToolServer | None:
        """The server of ``kind`` (the name from before servers)."""
        return self.server(kind)

    def runs(self, kind: str) -> bool:
        """Whether the server runs ``kind``'s calls (its items are registered)."""
        return tool_items(kind) is not None

    async def describe(self, context: ToolContext) -> list[ToolDescription]:
        """Every server's part of a response whose request names its tools (in the servers'
        order); none with ``tool_choice: none``."""
        if context.request.tool_choice == "none":
            return []
        return [
            await server.describe(context) for server in self.servers if server.has(context.request)
        ]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_kind)

    def __len__(self) -> int:
        return len(self._by_kind)
