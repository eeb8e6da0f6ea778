"""The tool loop's contract: what a tool the server runs gives the loop, and what it gets.

A kind of tool the server runs (``ToolSpec.kind``: ``"mcp"``, ``"browser"``, ``"python"``,
``"tool_search"``...) brings three things:

- its specs, so the model is shown the tools and harmony resolves its recipients to them: in
  ``ToolRegistry`` (harmony/tools.py), or from a `ToolProvider` the service asks per request
  (an MCP server's listing, which needs I/O);
- its items and events: a `ToolItemBuilder` registered with `register_tool_items` (in
  serve_app/protocol/, beside its item types); the translator opens the kind's item when the
  model's header names one of its tools, streams the arguments as the model writes them, and
  at ``<|call|>`` leaves it open, pending;
- its runner: a `ToolRunner` registered in the `ToolRunners` the service is built with.

The loop (loop.py) takes a completion's pending calls in the model's order, runs them
concurrently (each `ToolRunner.run` in a task of the response's `CancelScope`: a cancelled,
disconnected or steered response cancels them, as asyncio cancellation), writes each kind's
running and done events, closes the items in the model's order, appends each output as the
tool's harmony message (author: the recipient; channel commentary) and streams the model's
continuation with the same translator (same session id: the same engine replica, its cached
prefix). It ends at an answer, a client-run call, a call whose result `awaits_client` (an
approval request), ``max_tool_calls``, ``max_output_tokens`` or `ToolRunners.max_rounds`.

A runner never needs to raise: a `ToolResult` with ``error`` is a failed call item the model
reads. If one raises anyway, the loop logs it and makes it that failed item (never a 500).
Names here are stable: add, do not rename.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from serve_app.harmony.tools import ToolSpec
from serve_app.protocol.requests import ResponsesRequest
from serve_app.protocol.tool_items import (
    ToolItemBuilder,
    ToolResult,
    register_tool_items,
    server_run_kinds,
    tool_items,
)

__all__ = [
    "DEFAULT_MAX_ROUNDS",
    "CancelScope",
    "ToolCall",
    "ToolItemBuilder",
    "ToolProvider",
    "ToolResult",
    "ToolRunner",
    "ToolRunners",
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
    """Runs the calls of one tool kind."""

    async def run(self, call: ToolCall) -> ToolResult: ...


class ToolProvider(Protocol):
    """Specs a request's tools add that the request alone cannot say (an MCP server's listed
    tools): asked once per response, before rendering. An `APIError` it raises is the client's
    answer (a 400 naming the tool); any other failure is its own to turn into specs or none."""

    async def specs(self, request: ResponsesRequest, owner: str | None) -> Sequence[ToolSpec]: ...


class ToolRunners:
    """The runners the service is built with, by tool kind, and what they share: providers of
    specs and the bound on a response's rounds."""

    def __init__(
        self,
        runners: Mapping[str, ToolRunner] | None = None,
        *,
        providers: Sequence[ToolProvider] = (),
        max_rounds: int = DEFAULT_MAX_ROUNDS,
    ) -> None:
        self._runners: dict[str, ToolRunner] = dict(runners or {})
        self.providers: list[ToolProvider] = list(providers)
        self.max_rounds = max_rounds

    def register(self, kind: str, runner: ToolRunner) -> None:
        """Run ``kind``'s calls with ``runner`` (its items: `register_tool_items`)."""
        self._runners[kind] = runner

    def add_provider(self, provider: ToolProvider) -> None:
        self.providers.append(provider)

    def runner(self, kind: str) -> ToolRunner | None:
        return self._runners.get(kind)

    def runs(self, kind: str) -> bool:
        """Whether the server runs ``kind``'s calls (its items are registered)."""
        return tool_items(kind) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._runners)

    def __len__(self) -> int:
        return len(self._runners)
