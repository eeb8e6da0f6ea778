"""Rendering off the event loop (serve_app/serving/turn/render_pool.py): a large request renders
in a worker process while the loop goes on, to the same token ids and the same 400s as on the
loop, and one owner may queue only so many there (429)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_app.config import AppArgs, Limits
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.harmony.tool_messages import LongPiece, TooManyTokens, tool_message_tokens
from serve_app.harmony.tools import ToolRegistry
from serve_app.protocol.errors import InvalidRequest
from serve_app.protocol.requests import ResponsesRequest
from serve_app.serving.http.auth import ApiKeys
from serve_app.serving.turn.render_pool import RenderPool, text_size
from serve_app.serving.turn.rendering import Renderer, render_token_ids
from serve_app.serving.turn.state import Context
from tests.support import MODEL
from tests.support.helpers import EXEC_TOOL, in_process_api

# A piece just under the door's 20,000-character limit: ~0.15 s of tokenizing on a quiet core.
PIECE = "a" * 19_999
VAULT = ReasoningVault("render-pool-test")

ALWAYS_POOL = Limits(render_inline_chars=0, render_workers=1)
# A small context, so that the truncated request below is truncated.
ARGS = AppArgs(max_context_tokens=1200, limits=ALWAYS_POOL)


@pytest.fixture(scope="module")
def pool() -> Iterator[RenderPool]:
    """One pool for the module (each spawns its worker once): every request goes there."""
    rendering = RenderPool(ARGS, VAULT, render_token_ids)
    yield rendering
    rendering.close()


def _context(body: dict[str, Any], history: list | None = None) -> Context:
    request = ResponsesRequest.model_validate({"model": MODEL, **body})
    return Context(request, history or [], ToolRegistry.from_request(request))


def _requests() -> list[dict[str, Any]]:
    sealed = VAULT.seal("private chain of thought", owner="owner-a")
    return [
        {"input": "Hello"},
        {"input": "Run it", "instructions": "Be brief.", "tools": [EXEC_TOOL]},
        {
            "input": [
                {"role": "developer", "content": "Answer in JSON."},
                {"role": "user", "content": "list the files"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": sealed},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "exec",
                    "arguments": '{"cmd": "ls"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "a.py b.py"},
            ],
            "tools": [EXEC_TOOL],
            "reasoning": {"effort": "high"},
        },
        {
            "input": "Give me a person.",
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "person",
                    "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
                }
            },
        },
        # Truncated: the oldest of 30 turns dropped until the prompt leaves room for 100 tokens.
        {
            "input": [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 40}
                for i in range(30)
            ],
            "truncation": "auto",
            "max_output_tokens": 100,
        },
        {"input": f"{PIECE} {PIECE}"},
    ]


@pytest.mark.parametrize("index", range(len(_requests())))
@pytest.mark.parametrize("truncate", [True, False])
async def test_the_pool_renders_the_same_token_ids(
    pool: RenderPool, index: int, truncate: bool
) -> None:
    context = _context(_requests()[index])
    inline = render_token_ids(ARGS, VAULT, context, "owner-a", truncate)
    assert await pool.token_ids(context, "owner-a", truncate) == inline
    if index == 4 and truncate:  # it was truncated indeed
        assert len(inline) < len(render_token_ids(ARGS, VAULT, context, "owner-a", False))


async def test_a_tool_message_renders_in_a_worker_to_the_same_tokens_and_refusals(
    pool: RenderPool,
) -> None:
    """A tool's output (serving/tools/bounds.py) in a worker: the same token ids as on the
    loop, and its refusals (a piece past the limit, a bound's tokens) raised as they are."""
    args = ("browser.search", "analysis", "Zebras have stripes. " * 500, 10_000)
    inline = tool_message_tokens(*args)
    assert await pool.tokens_of(tool_message_tokens, args, len(args[2]), "owner-a") == inline
    with pytest.raises(LongPiece) as piece:
        await pool.tokens_of(tool_message_tokens, (*args[:2], "a" * 700_000, 10_000), 700_000, None)
    assert piece.value.length == 700_000
    with pytest.raises(TooManyTokens):
        await pool.tokens_of(tool_message_tokens, (*args[:3], 100), len(args[2]), None)
    assert pool.queued("owner-a") == 0 and pool.queued(None) == 0


async def test_a_rendering_error_is_the_same_400(pool: RenderPool) -> None:
    # What harmony's rendering itself refuses (here an item reference the door would have
    # resolved): `UnrenderableRequest`, the client's 400, from either side.
    context = _context({"input": [{"type": "item_reference", "id": "msg_unresolved"}]})
    errors = []
    for renderer in (Renderer(AppArgs(), VAULT), Renderer(ARGS, VAULT)):
        with pytest.raises(InvalidRequest) as refused:
            await renderer.render(context, None, truncate=False)
        errors.append((refused.value.status_code, refused.value.body()))
        renderer.pool.close()
    assert errors[0] == errors[1]
    assert "msg_unresolved" in errors[0][1]["error"]["message"]


def test_text_size_counts_text_and_nodes_until_past_its_limit() -> None:
    assert text_size(_context({"input": "Hello"}), 2048) < 100  # its fields, one each
    whole = text_size(_context({"input": "x" * 20_000}), 1 << 30)
    assert 20_000 < whole < 20_100
    assert 2048 < text_size(_context({"input": "x" * 20_000}), 2048) <= whole
    # Nodes count too: many small items are large.
    many = [{"role": "user", "content": "hi"}] * 5000
    assert text_size(_context({"input": many}), 2048) > 2048
    # The history too.
    history = _context({"input": "x" * 1500}).request.input_items
    assert text_size(_context({"input": "y" * 1500}, history), 2048) > 2048


async def _answers(api: Any, bodies: list[dict[str, Any]], path: str) -> list[tuple[int, Any]]:
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://app", timeout=120) as http:
        answers = []
        for body in bodies:
            response = await http.post(path, json={"model": MODEL, **body})
            answers.append((response.status_code, response.json()))
        return answers


async def test_the_same_answers_and_400s_through_the_api(tmp_path: Path) -> None:
    bodies = [
        *_requests(),
        # The door's 400: a compaction item this server cannot open.
        {"input": [{"type": "compaction", "encrypted_content": "not-sealed-here"}]},
        # Longer than the context, not truncated: the 400 after rendering.
        {"input": "word " * 3000},
        # As long, truncated to fit.
        {"input": [{"role": "user", "content": "word " * 300}] * 10, "truncation": "auto"},
    ]
    args = AppArgs(max_context_tokens=2000, default_max_output_tokens=100)
    pooled_args = args.model_copy(update={"limits": ALWAYS_POOL})
    async with in_process_api(tmp_path / "inline.db", args) as api:
        inline = await _answers(api, bodies, "/v1/responses/input_tokens")
        inline_turns = await _answers(api, bodies[-3:], "/v1/responses")
    async with in_process_api(tmp_path / "pool.db", pooled_args) as api:
        pooled = await _answers(api, bodies, "/v1/responses/input_tokens")
        pooled_turns = await _answers(api, bodies[-3:], "/v1/responses")
        assert api.state.service._renderer.pool._executor is not None  # it did go there
    assert pooled == inline
    assert [status for status, _ in inline[-3:]] == [400, 200, 200]
    assert [status for status, _ in inline_turns] == [400, 400, 200]
    assert inline_turns[0][1]["error"]["code"] == "invalid_encrypted_content"
    assert inline_turns[1][1]["error"]["code"] == "context_length_exceeded"
    for (status, answer), (pooled_status, pooled_answer) in zip(
        inline_turns, pooled_turns, strict=True
    ):
        assert pooled_status == status
        if status != 200:
            assert pooled_answer == answer
        else:  # a new response each: the same prompt, so the same usage
            assert pooled_answer["usage"] == answer["usage"]


async def _ticking_while(request: Any) -> tuple[float, float]:
    """The longest a coroutine ticking every 5 ms waited while ``request`` ran, and how long
    it ran."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    started = time.perf_counter()
    try:
        await request
    finally:
        done.set()
        await ticker
    took = time.perf_counter() - started
    return max(gaps, default=took), took  # never ticked: it waited the whole time


async def test_a_heavy_request_does_not_hold_the_loop(tmp_path: Path) -> None:
    # Six pieces just under the door's limit: ~1 s of tokenizing on a quiet core, all of it
    # on the event loop before the render pool.
    body = json.dumps({"model": MODEL, "input": " ".join([PIECE] * 6)})
    async with in_process_api(tmp_path / "heavy.db") as api:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://app", timeout=120) as c:

            async def count() -> None:
                response = await c.post(
                    "/v1/responses/input_tokens",
                    content=body,
                    headers={"content-type": "application/json"},
                )
                assert response.status_code == 200

            await count()  # the pool's worker started
            gap, took = await _ticking_while(count())
    # Judged generously (a shared, noisy machine): the loop ticked through most of it.
    # On the loop, the gap is the whole request.
    assert gap < max(0.25, took / 3), (gap, took)


async def test_one_owner_may_queue_only_so_much_text(tmp_path: Path) -> None:
    limits = Limits(render_inline_chars=0, render_workers=1, max_render_chars_per_owner=100_000)
    heavy = {"model": MODEL, "input": " ".join([PIECE] * 3)}  # 60,000 characters
    larger = {"model": MODEL, "input": " ".join([PIECE] * 6)}  # over the bound alone
    keys = ApiKeys(["key-a", "key-b"])
    owner_a = keys.owner("Bearer key-a")
    async with in_process_api(tmp_path / "bound.db", AppArgs(limits=limits), api_keys=keys) as api:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://app", timeout=120) as c:

            async def count(key: str, body: dict[str, Any] = heavy) -> httpx.Response:
                return await c.post(
                    "/v1/responses/input_tokens",
                    json=body,
                    headers={"authorization": f"Bearer {key}"},
                )

            first = asyncio.create_task(count("key-a"))
            pool = api.state.service._renderer.pool
            while not pool.queued(owner_a):
                await asyncio.sleep(0.01)
            refused = await count("key-a")  # 60,000 more would pass 100,000
            other = asyncio.create_task(count("key-b"))  # another owner: not refused
            assert (await first).status_code == 200
            assert (await other).status_code == 200
            assert pool.queued(owner_a) == 0
            again = await count("key-a")  # its text is rendered: it may again
            alone = await count("key-a", larger)  # nothing of its own there: passes
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "rate_limit_exceeded"
    assert error["param"] == "input"
    assert "max_render_chars_per_owner" in error["message"]
    assert again.status_code == 200
    assert alone.status_code == 200


# A replica that starts its pool and dies at once (SIGKILL: no shutdown), before its worker has
# loaded harmony's encoding: the worker must end on its own.
_DYING_REPLICA = """
import os, sys
from serve_app.config import AppArgs, Limits
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.serving.turn.render_pool import RenderPool
from serve_app.serving.turn.rendering import render_token_ids

pool = RenderPool(AppArgs(limits=Limits(render_workers=1)), ReasoningVault("k"), render_token_ids)
pool.warm()
print(os.getpid(), flush=True)
sys.stdin.read()
"""


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("delay_s", [0.0, 0.2, 0.5, 1.0, 3.0])
def test_a_worker_outlives_no_replica_killed_while_it_starts(delay_s: float) -> None:
    """Each delay kills the replica at another point of its worker's start (spawning, importing,
    loading the encoding, started): the worker is gone within a few seconds of it every time."""
    replica = subprocess.Popen(
        [sys.executable, "-c", _DYING_REPLICA],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert replica.stdout is not None
        replica.stdout.readline()
        workers: list[int] = []
        deadline = time.monotonic() + 30
        while not workers and time.monotonic() < deadline:
            # The resource tracker is a child too; the spawned worker is the one to watch.
            workers = [
                pid
                for pid in _children(replica.pid)
                if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
            ]
            time.sleep(0.02)
        assert workers, "the pool spawned no worker"
        time.sleep(delay_s)
    finally:
        replica.kill()
        replica.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers), f"worker {workers} outlived its replica"


async def test_warmed_waits_until_a_worker_has_started() -> None:
    """An ingress replica starting waits on `warmed` before it takes requests: it returns once
    a worker has started (harmony's encoding loaded), not at once; within a timeout too short
    for a spawn it says not yet."""
    warming = RenderPool(ARGS, VAULT, render_token_ids)
    try:
        assert await warming.warmed(0.001)  # nothing started: nothing to wait for
        warming.warm()
        assert not await warming.warmed(0.001)  # a spawned interpreter takes longer than that
        assert await warming.warmed(120)
        context = _context({"input": "Hello"})
        expected = render_token_ids(ARGS, VAULT, context, None, True)
        assert await asyncio.wait_for(warming.token_ids(context, None, True), 30) == expected
    finally:
        warming.close()
