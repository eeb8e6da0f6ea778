"""Rendering off the event loop: a large request's prompt is rendered (and truncated) in a
worker process, so no request holds the ingress's event loop, and with it every stream the
replica serves, for as long as harmony tokenizes it.

Why a process: harmony's tokenizer (Rust, `openai_harmony`) holds the GIL while it runs, so a
thread would not free the loop (two threads tokenizing take as long as one doing both, and a
ticking thread waits out each call: docs/reliability.md). Byte-pair merging is quadratic in a
piece's length: a piece just under the door's 20,000-character limit costs ~0.14 s, so a
valid 7.6 MB body of them renders for ~40-55 s.

Why not everything: a request with at most `Limits.render_inline_chars` characters of text
(2,048, nodes counted as one each) renders on the loop: whatever its pieces, that holds it
about as long as sending it to a worker costs the loop (~0.4 ms of the loop thread's CPU per
job, whatever its size; the round trip adds a few ms of latency): docs/reliability.md.

The pool's workers are spawned (not forked: an ingress replica runs threads) as the ingress
replica starts (`warm`; elsewhere at the first request that needs one), each loading harmony's
encoding once; `Limits.render_workers` of them.
One owner (API key digest; None for an open API) may have at most
`Limits.max_render_chars_per_owner` characters queued or rendering there (a request larger
than that alone passes when the owner has nothing there); more is a 429
``rate_limit_exceeded`` (param ``input``) at once, so one tenant cannot stack a queue of heavy
requests ahead of the others'. Counted in characters, not requests, so ordinary requests
(kilobytes each) in bursts are never refused. A job counts until its worker is done with it,
even when its client left (a running job cannot be stopped; a queued one is dropped).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from pydantic import BaseModel

from serve_app.config import AppArgs
from serve_app.harmony.encoding import get_encoding
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.protocol.errors import RateLimited, ServerError
from serve_app.serving.turn.state import Context

logger = logging.getLogger(__name__)

# (args, vault, context, owner, truncate) -> token ids; raises `UnrenderableRequest`.
RenderFn = Callable[[AppArgs, ReasoningVault, Context, str | None, bool], list[int]]

# What a worker process holds: set once by `_start_worker`.
_worker: tuple[AppArgs, ReasoningVault, RenderFn] | None = None


class RenderPool:
    def __init__(self, args: AppArgs, vault: ReasoningVault, render: RenderFn) -> None:
        self._args = args
        self._vault = vault
        self._render = render
        self._limits = args.limits
        self._executor: ProcessPoolExecutor | None = None
        self._queued: Counter[str | None] = Counter()  # characters queued or rendering, by owner
        self._warming: list[Future] = []  # the jobs `warm` sent

    async def token_ids(self, context: Context, owner: str | None, truncate: bool) -> list[int]:
        """``context``'s prompt token ids, rendered here when it is small, else in a worker."""
        bound = self._limits.max_render_chars_per_owner
        size = text_size(context, max(bound, self._limits.render_inline_chars))
        if size <= self._limits.render_inline_chars:
            return self._render(self._args, self._vault, context, owner, truncate)
        return await self._in_worker(owner, min(size, bound), _render_job, context, owner, truncate)

    async def tokens_of(
        self, render: Callable[..., list[int]], args: tuple[Any, ...], size: int, owner: str | None
    ) -> list[int]:
        """``render(*args)``: token ids of text that is not a request's (a tool's output as
        the next prompt holds it), here when ``size`` (its characters) is at most
        ``render_inline_chars``, else in a worker, counted against ``owner``'s bound as a
        request is. ``render`` is a module-level function: a worker imports it by name."""
        if size <= self._limits.render_inline_chars:
            return render(*args)
        bound = self._limits.max_render_chars_per_owner
        return await self._in_worker(owner, min(size, bound), _call_job, render, *args)

    async def _in_worker(
        self, owner: str | None, size: int, job_fn: Callable[..., array], *args: Any
    ) -> list[int]:
        """``job_fn(*args)`` in a worker, ``size`` characters counted against ``owner``'s
        bound while it is queued or running (a 429 `RateLimited` past it)."""
        self._admit(owner, size)
        loop = asyncio.get_running_loop()
        try:
            job = self._pool().submit(job_fn, *args)
        except BrokenProcessPool:
            self._executor = None  # a worker died: a new pool
            job = self._pool().submit(job_fn, *args)
        self._queued[owner] += size
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release, owner, size))
        try:
            ids = await asyncio.wrap_future(job)
        except BrokenProcessPool as error:
            self._executor = None
            logger.error("a render worker died: %s", error)
            raise ServerError("The request could not be rendered: a worker stopped.") from error
        return ids.tolist()

    def warm(self) -> None:
        """Start the workers now, not at the first request that needs one (a worker takes
        seconds to start in a Ray replica: measured 12.7 s under load, docs/reliability.md)."""
        pool = self._pool()
        self._warming = [pool.submit(_warm) for _ in range(self._limits.render_workers)]

    async def warmed(self, timeout_s: float) -> bool:
        """Wait until the jobs `warm` sent are done, so that a worker has loaded harmony's
        encoding, at most ``timeout_s``: whether they are. A replica that took requests before
        would hold every large one it got until then (each of them waited seconds in a rolling
        upgrade, when Serve's proxy sends most requests to the replica with the fewest). A
        worker that failed to start is logged: the first request that needs one starts another."""
        if not self._warming:
            return True
        jobs = [asyncio.wrap_future(job) for job in self._warming]
        done, pending = await asyncio.wait(jobs, timeout=timeout_s)
        for job in pending:
            job.cancel()  # the wrapper only: the job itself still starts its worker
        failed = [job.exception() for job in done if job.exception() is not None]
        if failed:
            self._executor = None
            logger.error("a render worker did not start: %r", failed[0])
        return not pending and not failed

    def queued(self, owner: str | None) -> int:
        """The characters of the owner's requests queued or rendering in the pool now."""
        return self._queued[owner]

    def close(self) -> None:
        """Stop the workers (queued jobs are dropped)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _admit(self, owner: str | None, size: int) -> None:
        """Within the owner's bound; a request over it alone passes when the owner has nothing
        in the pool (a request that rendered before the bound still renders)."""
        bound = self._limits.max_render_chars_per_owner
        queued = self._queued[owner]
        if queued and queued + size > bound:
            refused = RateLimited(
                f"Too much text of this API key is being rendered: {queued:,} characters are "
                f"queued, and this request's {size:,} more would pass the {bound:,} allowed "
                "(limits.max_render_chars_per_owner). Please try again in 1s."
            )
            refused.param = "input"
            raise refused

    def _release(self, owner: str | None, size: int) -> None:
        self._queued[owner] -= size
        if self._queued[owner] <= 0:
            del self._queued[owner]

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self._limits.render_workers,
                # Not fork: the replica runs threads (Ray's, the store's), which a fork copies
                # mid-flight. Spawn starts each worker from a fresh interpreter.
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                # The replica's pid, read here: a worker that asked for its parent's once
                # started would get init's (1) if the replica died while it started, and wait
                # for a parent that is already gone.
                initargs=(self._args, self._vault, self._render, os.getpid()),
            )
        return self._executor


def text_size(context: Context, limit: int) -> int:
    """The characters of text in ``context`` (its request and history), each other node
    counted as one; walked until past ``limit``, so a count costs at most ``limit`` steps
    (and never more than the door's own walk of the request, `check_text`)."""
    total = 0
    stack: list[object] = [context.request, context.history]
    while stack and total <= limit:
        node = stack.pop()
        total += len(node) if isinstance(node, str) else 1
        if isinstance(node, BaseModel):
            stack.extend(getattr(node, name) for name in type(node).model_fields)
            stack.extend((node.__pydantic_extra__ or {}).values())
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return total


def _start_worker(args: AppArgs, vault: ReasoningVault, render: RenderFn, parent: int) -> None:
    global _worker
    _worker = (args, vault, render)
    # Below the replica's own threads: on a busy machine the streams' event loop gets the CPU
    # before a render does (a render is throughput, a stream's next token is latency).
    os.nice(10)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    get_encoding()  # loaded once per worker, before its first job


def _exit_with(parent: int) -> None:
    """A worker outlives no replica: a replica killed (not shut down) leaves its workers
    waiting for jobs that never come; each checks every second that its parent (``parent``,
    the replica's pid) is still its parent, from before it loads anything."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _warm() -> None:
    """A job that only makes sure its worker has started."""


def _call_job(render: Callable[..., list[int]], *args: Any) -> array:
    """In a worker: ``render(*args)``'s token ids, as an array."""
    return array("I", render(*args))


def _render_job(context: Context, owner: str | None, truncate: bool) -> array:
    """In a worker: the token ids, as an array (pickled as bytes, not one object per id)."""
    if _worker is None:
        raise RuntimeError("render worker not started")
    args, vault, render = _worker
    return array("I", render(args, vault, context, owner, truncate))
