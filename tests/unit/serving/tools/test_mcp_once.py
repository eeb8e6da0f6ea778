"""Exactly once (issue 46): nothing of a request's MCP work runs before its response exists (an
engine took it, it is stored when it is to be, ``response.created`` is out), each step streams
as it starts, and an approval is consumed once: however often, and however concurrently, one
``mcp_approval_response`` is sent, its call runs once and every answer carries that run's result.

The whole app in this process (no Ray). The side effect is real: the ``good`` test MCP server's
``charge`` tool counts its calls (tests/support/mcp_servers.py). Where a test must hold a step
while it looks at the stream, the MCP client's listing or call is replaced by one that waits for
the test (`Gate`). Two apps on one store are two ingress replicas (the serve tier's
tests/app/test_mcp_once.py does it with the session app's two).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.responses.response_output_item import McpListToolsTool
from websockets.asyncio.client import connect

from serve_app.config import AppArgs, ToolArgs
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.protocol.errors import RateLimited
from serve_app.serving.engine.client import EngineClient
from serve_app.serving.tools.mcp.client import CallOutcome, ListOutcome, McpClient, McpServer
from tests.support import MODEL
from tests.support.helpers import in_process_api, on_uvicorn, sdk_client
from tests.support.mcp_servers import McpTestServer, mcp_server
from tests.unit.store.test_sql import postgres_url, store_url  # noqa: F401 - fixtures

SCRIPT = {
    "turns": [
        # The approved call's output is the prompt's last message: the model answers it.
        {"match": r"charge #\d+ of \d+", "items": [{"text": "Charged."}]},
        {"match": "echo ran", "items": [{"text": "Echoed."}]},
        {
            "match": "DOCS-ECHO-TASK",
            "items": [
                {"function_call": {"namespace": "docs", "name": "echo", "arguments": {"text": "x"}}}
            ],
        },
        {
            "match": "CHARGE-TASK",
            "items": [
                {"reasoning": "The user wants a charge."},
                {
                    "function_call": {
                        "namespace": "pay",
                        "name": "charge",
                        "arguments": {"amount": 5},
                    }
                },
            ],
        },
    ]
}
ENGINE = SimulatedEngineConfig(script=SCRIPT, decode_tokens_per_s=50_000)
ROUNDS = 8  # approvals raced for, each by SENDERS senders after random pauses of their own
SENDERS = 4
FAKE_URL = "http://127.0.0.1:9/mcp"  # never reached: the tests that name it replace the client
WAIT_S = 20.0


@pytest.fixture(scope="module")
def good() -> McpTestServer:
    with mcp_server("good") as server:
        yield server


def pay(server_url: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "pay",
        "server_url": server_url,
        "require_approval": "always",
        **fields,
    }


def docs(**fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "docs",
        "server_url": FAKE_URL,
        "require_approval": "never",
        **fields,
    }


def approve(request_id: str) -> dict[str, Any]:
    return {"type": "mcp_approval_response", "approval_request_id": request_id, "approve": True}


def the(response: Any, item_type: str) -> Any:
    (item,) = [item for item in response.output if item.type == item_type]
    return item


def args_for(*origins: str, **more: Any) -> AppArgs:
    return AppArgs.model_validate({"tools": {"mcp_allow": list(origins)}, **more})


@asynccontextmanager
async def app(db: Path | str, *origins: str, **options: Any) -> AsyncIterator[Any]:
    args = options.pop("args", None) or args_for(*origins)
    async with in_process_api(db, args, engine=ENGINE, **options) as api:
        yield api


async def charges(server: McpTestServer) -> int:
    """How many charges the server made (asked of it directly, not through the app)."""
    client = McpClient(ToolArgs(mcp_allow=[server.origin]))
    try:
        outcome = await client.call_tool(McpServer(server.url), "charges", {})
    finally:
        close = getattr(client, "aclose", None)
        if close is not None:
            await close()
    assert outcome.error is None, outcome.message
    return int(outcome.output or "0")


async def ask(client: AsyncOpenAI, url: str) -> str:
    """A response that ends with an approval request for `pay.charge`; the request's id."""
    asked = await client.responses.create(model=MODEL, input="CHARGE-TASK", tools=[pay(url)])
    return the(asked, "mcp_approval_request").id


async def approved(client: AsyncOpenAI, previous: str, request_id: str, url: str, **more: Any):
    return await client.responses.create(
        model=MODEL,
        previous_response_id=previous,
        input=[approve(request_id), *more.pop("extra", [])],
        tools=[pay(url)],
        **more,
    )


async def test_one_approval_sent_three_times_runs_its_call_once(tmp_path, good) -> None:
    """By ``previous_response_id``, three times in a row: one charge, three answers with it."""
    async with app(tmp_path / "s.db", good.origin) as api:
        client = sdk_client(api)
        asked = await client.responses.create(
            model=MODEL, input="CHARGE-TASK", tools=[pay(good.url)]
        )
        request_id = the(asked, "mcp_approval_request").id
        before = await charges(good)
        answers = [await approved(client, asked.id, request_id, good.url) for _ in range(3)]
    assert await charges(good) == before + 1
    calls = [the(answer, "mcp_call") for answer in answers]
    assert {call.approval_request_id for call in calls} == {request_id}
    assert len({call.output for call in calls}) == 1, [call.output for call in calls]
    assert calls[0].output == f"charge #{before + 1} of 5"
    assert all(answer.output_text == "Charged." for answer in answers)


async def test_concurrent_senders_of_one_approval_run_it_once_across_replicas(
    tmp_path,
    good,
    store_url: str,  # noqa: F811
) -> None:
    """Two apps on one store (two replicas), ``SENDERS`` senders per approval spread over
    both, each after a random pause: every round, one charge and one result for all."""
    rng = random.Random(46)
    async with app(store_url, good.origin) as one, app(store_url, good.origin) as two:
        clients = [sdk_client(one), sdk_client(two)]
        for round_ in range(ROUNDS):
            asked = await clients[round_ % 2].responses.create(
                model=MODEL, input="CHARGE-TASK", tools=[pay(good.url)]
            )
            request_id = the(asked, "mcp_approval_request").id
            before = await charges(good)

            async def send(
                client: AsyncOpenAI,
                pause: float,
                previous: str = asked.id,
                asked_id: str = request_id,
            ):
                await asyncio.sleep(pause)
                return await approved(client, previous, asked_id, good.url)

            answers = await asyncio.gather(
                *(send(clients[i % 2], rng.uniform(0, 0.05)) for i in range(SENDERS))
            )
            assert await charges(good) == before + 1, f"round {round_}"
            outputs = {the(answer, "mcp_call").output for answer in answers}
            assert outputs == {f"charge #{before + 1} of 5"}, f"round {round_}: {outputs}"


class Refusing:
    """The engine client, refusing its next ``refuse`` requests as engines at capacity do
    (`RateLimited` before any chunk: the client's 429)."""

    def __init__(self, inner: EngineClient) -> None:
        self.inner = inner
        self.refuse = 0

    def stream(self, request):
        if self.refuse:
            self.refuse -= 1
            return self._refused()
        return self.inner.stream(request)

    async def _refused(self):
        raise RateLimited()
        yield  # an async generator

    async def ping(self) -> None:
        await self.inner.ping()

    async def await_routable(self, session_id: str) -> bool:
        return await self.inner.await_routable(session_id)


async def test_a_turn_refused_with_429_runs_nothing_and_its_retry_runs_once(tmp_path, good) -> None:
    engines: list[Refusing] = []

    def refusing(inner: EngineClient) -> EngineClient:
        engines.append(Refusing(inner))
        return engines[-1]

    async with app(tmp_path / "s.db", good.origin, engine_client=refusing) as api:
        client = sdk_client(api)
        asked = await client.responses.create(
            model=MODEL, input="CHARGE-TASK", tools=[pay(good.url)]
        )
        request_id = the(asked, "mcp_approval_request").id
        before = await charges(good)
        engines[0].refuse = 2
        for _ in range(2):
            with pytest.raises(openai.RateLimitError):
                await approved(client, asked.id, request_id, good.url)
        assert await charges(good) == before  # refused: nothing ran
        retried = [await approved(client, asked.id, request_id, good.url) for _ in range(2)]
    assert await charges(good) == before + 1
    assert {the(answer, "mcp_call").output for answer in retried} == {f"charge #{before + 1} of 5"}


async def test_a_turn_refused_with_400_runs_nothing_and_its_retry_runs_once(tmp_path, good) -> None:
    """The approving request's input overflows the context: a 400 before the call runs."""
    # A context this small leaves a tool's output room only with a small reserve (bounds.py).
    tools = {"mcp_allow": [good.origin], "output_reserve_tokens": 256}
    args = AppArgs.model_validate({"tools": tools, "max_context_tokens": 2048})
    async with app(tmp_path / "s.db", args=args) as api:
        client = sdk_client(api)
        asked = await client.responses.create(
            model=MODEL, input="CHARGE-TASK", tools=[pay(good.url)]
        )
        request_id = the(asked, "mcp_approval_request").id
        before = await charges(good)
        long = {"role": "user", "content": "word " * 3000}
        with pytest.raises(openai.BadRequestError) as refused:
            await approved(client, asked.id, request_id, good.url, extra=[long])
        assert refused.value.body["code"] == "context_length_exceeded"
        assert await charges(good) == before
        retried = await approved(client, asked.id, request_id, good.url)
    assert await charges(good) == before + 1
    assert the(retried, "mcp_call").output == f"charge #{before + 1} of 5"


# --- each step streams as it starts: held by a gate the test opens -------------------------

ECHO = McpListToolsTool(
    name="echo",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
    description="Echo.",
)


class Gate:
    """Replaces the MCP client's listing and call: each waits until the test opens the gate,
    and is counted."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.listed = 0
        self.called = 0

    async def list_tools(self, server: McpServer) -> ListOutcome:
        self.listed += 1
        await self.opened.wait()
        return ListOutcome(tools=[ECHO])

    async def call_tool(self, server: McpServer, name: str, arguments: Any) -> CallOutcome:
        self.called += 1
        await self.opened.wait()
        return CallOutcome(output=f"{name} ran")


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    held = Gate()

    async def list_tools(client: McpClient, server: McpServer) -> ListOutcome:
        return await held.list_tools(server)

    async def call_tool(client: McpClient, server: McpServer, name: str, arguments: Any):
        return await held.call_tool(server, name, arguments)

    monkeypatch.setattr(McpClient, "list_tools", list_tools)
    monkeypatch.setattr(McpClient, "call_tool", call_tool)
    return held


def served_client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def test_the_listing_streams_in_progress_before_it_is_done_and_after_the_response_exists(
    tmp_path, gate: Gate
) -> None:
    async with app(tmp_path / "s.db", "http://127.0.0.1:9") as api, on_uvicorn(api) as url:
        client = served_client(url)
        seen: list[str] = []

        async def read() -> Any:
            stream = await client.responses.create(
                model=MODEL, input="hi", tools=[docs()], stream=True
            )
            async for event in stream:
                seen.append(event.type)
                if event.type == "response.created":
                    response_id = event.response.id
                if event.type == "response.mcp_list_tools.in_progress":
                    assert gate.listed <= 1 and not gate.opened.is_set()
                    # Stored before the listing: another client finds it in progress.
                    stored = await client.responses.retrieve(response_id)
                    assert stored.status == "in_progress"
                    gate.opened.set()
                if event.type == "response.completed":
                    return event.response

        final = await asyncio.wait_for(read(), WAIT_S)
    assert seen[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
    ]
    assert seen[4:6] == ["response.mcp_list_tools.completed", "response.output_item.done"]
    assert final.output[0].type == "mcp_list_tools" and final.output[0].tools[0].name == "echo"


async def test_an_approved_call_streams_in_progress_before_it_runs(tmp_path, gate: Gate) -> None:
    """The listing is open from the start here; the call waits for the test."""
    gate.opened.set()
    async with app(tmp_path / "s.db", "http://127.0.0.1:9") as api, on_uvicorn(api) as url:
        client = served_client(url)
        tool = docs(require_approval="always")
        script_call = await client.responses.create(
            model=MODEL, input="DOCS-ECHO-TASK", tools=[tool]
        )
        request = the(script_call, "mcp_approval_request")
        gate.opened.clear()
        seen: list[str] = []

        async def read() -> None:
            stream = await client.responses.create(
                model=MODEL,
                previous_response_id=script_call.id,
                input=[approve(request.id)],
                tools=[tool],
                stream=True,
            )
            async for event in stream:
                seen.append(event.type)
                if event.type == "response.mcp_call.in_progress":
                    assert gate.called <= 1 and not gate.opened.is_set()
                    gate.opened.set()
                if event.type == "response.completed":
                    return

        await asyncio.wait_for(read(), WAIT_S)
    assert gate.called == 1
    assert seen.index("response.created") < seen.index("response.mcp_call.in_progress")
    assert seen.index("response.mcp_call.in_progress") < seen.index("response.mcp_call.completed")


async def test_a_background_request_is_answered_queued_before_any_listing(
    tmp_path, gate: Gate
) -> None:
    async with app(tmp_path / "s.db", "http://127.0.0.1:9") as api:
        client = sdk_client(api)
        started = await asyncio.wait_for(
            client.responses.create(model=MODEL, input="hi", tools=[docs()], background=True),
            WAIT_S,
        )
        assert started.status in ("queued", "in_progress") and not gate.opened.is_set()
        gate.opened.set()
        for _ in range(200):
            done = await client.responses.retrieve(started.id)
            if done.status == "completed":
                break
            await asyncio.sleep(0.05)
    assert done.status == "completed" and done.output[0].type == "mcp_list_tools"
    assert gate.listed == 1


async def test_a_prewarm_with_an_mcp_tool_runs_nothing(tmp_path, gate: Gate) -> None:
    """HTTP (plain and SSE) and WebSocket ``generate: false``: answered completed, with no
    output, and nothing listed or called."""
    warm = {"prompt_cache_options": {"prewarm": True}}
    body = {"model": MODEL, "input": "hi", "tools": [docs()], **warm}
    async with app(tmp_path / "s.db", "http://127.0.0.1:9") as api, on_uvicorn(api) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http:
            plain = await http.post("/v1/responses", json=body)
            streamed = await http.post("/v1/responses", json={**body, "stream": True})
        ws_url = url.replace("http://", "ws://", 1) + "/v1/responses"
        async with connect(ws_url) as socket:
            create = {"type": "response.create", "generate": False}
            await socket.send(
                json.dumps({**create, "model": MODEL, "input": "hi", "tools": [docs()]})
            )
            events = []
            while not events or events[-1]["type"] not in TERMINAL:
                events.append(json.loads(await asyncio.wait_for(socket.recv(), WAIT_S)))
    assert plain.status_code == 200, plain.text
    assert plain.json()["status"] == "completed" and plain.json()["output"] == []
    assert streamed.status_code == 200 and "response.completed" in streamed.text
    assert [event["type"] for event in events] == ["response.created", "response.completed"]
    assert gate.listed == 0 and gate.called == 0


TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
