"""The MCP sessions of one ingress replica, kept open between operations (issue 46): one per
(owner, server URL, headers), so a response's listing and calls, and an owner's responses
within ``ttl_s`` of each other, speak over one initialized session (one HTTP exchange an
operation) instead of opening one each (resolve, connect, ``initialize``, ``initialized``, the
operation, ``DELETE``: four exchanges or more, ~11 ms of the ingress's CPU).

- **Never shared across owners**: the key holds the owner (the digest of the API key) and a
  digest of every header sent (credentials among them); a session sends its own headers only.
- **Each session lives in a task of its own** (`_Held.hold`), which opens it (within the
  connect timeout), keeps it while it is used, and ends it (the SDK's ``DELETE``, bounded by the
  connect timeout) when asked: the `mcp` SDK's transports run anyio task groups whose cancel
  scopes must be entered and left by one task. Operations run in their callers' tasks, over
  the session's streams (concurrent requests on one session are the SDK's to multiplex).
- **Ended** when idle past ``ttl_s`` (a sweep every half TTL), when it broke (its transport
  failed: a response over its bound, another origin, the connection lost; the operations on it
  fail with that reason), and all of them on `close`. Past ``max_sessions``, the least recently
  used idle one is ended for a new one; with none idle, the new one serves its operation alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import mcp_types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from serve_app.serving.tools.mcp.transport import Guard

logger = logging.getLogger(__name__)

# Opens a session with a server on ``stack`` (its transport, the pinned client), initialized,
# its transport reporting to ``guard``.
Opener = Callable[[contextlib.AsyncExitStack, Guard], Awaitable[ClientSession]]


class SessionBroken(Exception):
    """The session could not be opened, or broke: ``cause`` says why (what the transport's
    guard saw, else the exception)."""

    def __init__(self, cause: BaseException | None, guard: Guard) -> None:
        super().__init__(guard.failure or repr(cause))
        self.cause = cause
        self.guard = guard


class _Held:
    """One open session and the task that holds it."""

    def __init__(self, key: str, pooled: bool) -> None:
        self.key = key
        self.pooled = pooled
        self.guard = Guard()
        self.session: ClientSession | None = None
        self.failure: BaseException | None = None
        self.ready = asyncio.Event()
        self.ending = asyncio.Event()
        self.users = 0
        self.last_used = time.monotonic()
        # The operations running on it: cancelled at once should its transport fail.
        self.scopes: set[anyio.CancelScope] = set()
        self.guard.on_failure = self.broke
        self.task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return not (self.ending.is_set() or self.failure is not None or self.guard.failure)

    def broke(self) -> None:
        """Its transport failed: its operations fail now, and it is ended."""
        for scope in list(self.scopes):
            scope.cancel()
        self.ending.set()

    async def hold(self, opener: Opener, end_within_s: float) -> None:
        """Open the session, keep it until it is to end, end it (within ``end_within_s``)."""
        try:
            with anyio.CancelScope() as scope:
                async with contextlib.AsyncExitStack() as stack:
                    self.session = await opener(stack, self.guard)
                    self.ready.set()
                    await self.ending.wait()
                    scope.deadline = anyio.current_time() + end_within_s
        except Exception as error:  # opening failed, or the transport's tasks did
            self.failure = error
            if self.session is not None:
                logger.info("MCP session ended by a failure: %s", type(error).__name__)
        finally:
            self.session = self.session if self.failure is None else None
            self.ending.set()
            self.ready.set()


class McpSessions:
    """The open sessions, by key (`McpServer.session_key`)."""

    def __init__(self, ttl_s: float, max_sessions: int, end_within_s: float) -> None:
        self._ttl_s = ttl_s
        self._max = max_sessions
        self._end_within_s = end_within_s
        self._held: dict[str, _Held] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._held)

    @contextlib.asynccontextmanager
    async def use(
        self, key: str, opener: Opener, scope: anyio.CancelScope
    ) -> AsyncIterator[tuple[ClientSession, Guard, bool]]:
        """The session of ``key`` (opened with ``opener`` unless one is open) for one operation
        running in ``scope`` (cancelled should the session break); with its guard, and whether
        it was open before (a reused session). `SessionBroken` if it cannot be opened."""
        held, reused = self._take(key, opener)
        held.users += 1
        held.scopes.add(scope)
        try:
            await held.ready.wait()
            if held.session is None:
                raise SessionBroken(held.failure, held.guard)
            try:
                yield held.session, held.guard, reused
            except MCPError as error:
                if error.code != mcp_types.CONNECTION_CLOSED:
                    raise
                # The session's streams closed under the operation (its transport's task
                # failed: an SSE event over the SDK's cap, the server gone): it is ended, and
                # what ended it is the operation's error.
                await self._ended(held)
                if held.failure is None:
                    raise
                raise SessionBroken(held.failure, held.guard) from None
        finally:
            held.scopes.discard(scope)
            held.users -= 1
            held.last_used = time.monotonic()
            if not held.pooled and not held.users:
                held.ending.set()

    async def _ended(self, held: _Held) -> None:
        """End ``held`` and wait (bounded) for its task to say why it ended."""
        held.ending.set()
        if held.task is not None:
            await asyncio.wait({held.task}, timeout=self._end_within_s)

    def discard(self, key: str) -> None:
        """End the session of ``key`` (it answered as one the server no longer knows)."""
        held = self._held.pop(key, None)
        if held is not None:
            held.ending.set()

    def close(self) -> None:
        """End every session (without waiting: `aclose` waits)."""
        self._closed = True
        for held in self._held.values():
            held.ending.set()
        self._held.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def aclose(self) -> None:
        """End every session and wait for them to end (their ``DELETE`` sent)."""
        self.close()
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=self._end_within_s + 1)

    def _take(self, key: str, opener: Opener) -> tuple[_Held, bool]:
        held = self._held.get(key)
        if held is not None and held.alive:
            return held, held.ready.is_set()
        pooled = not self._closed and (len(self._held) < self._max or self._evict_idle())
        held = _Held(key, pooled)
        if pooled:
            self._held[key] = held
            self._sweep_soon()
        # A context of its own: the session outlives the request that opened it.
        task = asyncio.create_task(
            self._run(held, opener), name="mcp session", context=contextvars.Context()
        )
        held.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return held, False

    async def _run(self, held: _Held, opener: Opener) -> None:
        try:
            await held.hold(opener, self._end_within_s)
        finally:
            if self._held.get(held.key) is held:
                del self._held[held.key]

    def _evict_idle(self) -> bool:
        """End the least recently used idle session; whether there was one."""
        idle = [held for held in self._held.values() if not held.users]
        if not idle:
            return False
        oldest = min(idle, key=lambda held: held.last_used)
        self.discard(oldest.key)
        return True

    def _sweep_soon(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(
                self._sweep(), name="mcp session sweep", context=contextvars.Context()
            )

    async def _sweep(self) -> None:
        """End the sessions idle past the TTL, every half TTL, while any is open."""
        while self._held:
            await asyncio.sleep(self._ttl_s / 2)
            cutoff = time.monotonic() - self._ttl_s
            for held in list(self._held.values()):
                if not held.users and held.last_used <= cutoff:
                    self.discard(held.key)
