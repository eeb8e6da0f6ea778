"""One tenant cannot starve the others: WebSocket connections per key and per replica, idle
WebSockets, WebSocket input in bytes, slow request bodies.

The ingress's own FastAPI app runs in this process on uvicorn (real sockets: idle connections
and trickled bodies are what is tested), with small limits and API keys, behind `RequestSlots`,
a model of what Ray Serve does in front of an ingress replica: every HTTP request and every
WebSocket connection holds one of the replica's `max_ongoing_requests` slots from its start to
its end, and a request that finds none waits (Serve's proxy queues it). Each starvation test
runs twice: with the app's limits loose (as before them), the model must show the starvation
(`/health` not answered), or the test proves nothing; with the limits, it must not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from serve_app.config import AppArgs, Limits
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.serving.http.auth import ApiKeys
from tests.support import ENGINE_SCRIPT, MODEL
from tests.support.helpers import in_process_api, on_uvicorn

ALICE, BOB = "key-alice", "key-bob"
# The replica's request slots in the model (Serve's `max_ongoing_requests`: 256 on the ingress).
SLOTS = 8
# How long a request may wait for a slot before it counts as starved: three of the slow-body
# tests' deadlines (so a request a deadline frees is served well within it).
BODY_DEADLINE_S = 0.5
STARVED_AFTER_S = 3 * BODY_DEADLINE_S


class RequestSlots:
    """Ray Serve's `max_ongoing_requests` on one replica, as seen from the app: each HTTP
    request or WebSocket connection holds a slot until it ends; the next one waits for a slot."""

    def __init__(self, app: ASGIApp, slots: int) -> None:
        self.app = app
        self.semaphore = asyncio.Semaphore(slots)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        async with self.semaphore:
            await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def running_app(tmp_path: Path, **limits: float) -> AsyncIterator[str]:
    """The app with these `Limits`, keys for Alice and Bob, behind `RequestSlots`; its URL."""
    scripted = SimulatedEngineConfig(script=str(ENGINE_SCRIPT), decode_tokens_per_s=50_000)
    args = AppArgs(limits=Limits(**limits))
    keys = ApiKeys([ALICE, BOB])
    async with (
        in_process_api(tmp_path / "limits.db", args, engine=scripted, api_keys=keys) as api,
        # keep-alive longer than any test waits: a connection closed was closed by the app.
        on_uvicorn(RequestSlots(api, SLOTS), timeout_keep_alive=60) as url,
    ):
        yield url


def _socket_url(url: str) -> str:
    return url.replace("http://", "ws://", 1) + "/v1/responses"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _served_in_time(url: str) -> dict[str, bool]:
    """Whether `/health` and Bob's request were answered before they counted as starved."""
    async with httpx.AsyncClient(base_url=url, timeout=STARVED_AFTER_S) as http:

        async def served(method: str, path: str, **options) -> bool:
            try:
                return (await http.request(method, path, **options)).status_code == 200
            except httpx.TimeoutException:
                return False

        health, bob = await asyncio.gather(
            served("GET", "/health"),
            served(
                "POST",
                "/v1/responses/input_tokens",
                json={"model": MODEL, "input": "hi"},
                headers=_auth(BOB),
            ),
        )
    return {"health": health, "other key": bob}


async def _refusal(socket: ClientConnection) -> tuple[dict, int]:
    """The error event a refused connection gets, and its close code."""
    event = json.loads(await asyncio.wait_for(socket.recv(), 5))
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(socket.recv(), 5)
    return event, closed.value.rcvd.code


@pytest.mark.parametrize("limited", [False, True], ids=["limits loose", "limits set"])
async def test_one_keys_idle_websockets_leave_slots_for_others(
    tmp_path: Path, limited: bool
) -> None:
    # Alice opens as many connections as the replica has slots, and leaves them idle.
    per_key = 2 if limited else SLOTS
    limits = {"max_websockets_per_key": per_key, "max_websockets_per_replica": 100}
    async with running_app(tmp_path, **limits) as url, contextlib.AsyncExitStack() as stack:
        sockets = [
            await stack.enter_async_context(
                connect(_socket_url(url), additional_headers=_auth(ALICE))
            )
            for _ in range(SLOTS)
        ]
        for refused in sockets[per_key:]:
            event, code = await _refusal(refused)
            assert code == 1013  # try again later
            assert event["type"] == "error" and event["status"] == 429
            assert event["error"]["code"] == "rate_limit_exceeded"
            assert set(event["error"]) == {"message", "type", "param", "code"}
        served = await _served_in_time(url)
    # Loose, the model starves everyone else; with the limit, Alice holds 2 slots of 8.
    assert served == {"health": limited, "other key": limited}


async def test_connections_beyond_the_replicas_limit_are_refused(tmp_path: Path) -> None:
    limits = {"max_websockets_per_key": 5, "max_websockets_per_replica": 3}
    async with running_app(tmp_path, **limits) as url, contextlib.AsyncExitStack() as stack:
        for key in (ALICE, ALICE, BOB):
            await stack.enter_async_context(
                connect(_socket_url(url), additional_headers=_auth(key))
            )
        async with connect(_socket_url(url), additional_headers=_auth(BOB)) as refused:
            event, code = await _refusal(refused)
        assert code == 1013 and event["status"] == 429
        assert "on this server" in event["error"]["message"]


async def test_an_idle_websocket_is_closed_and_frees_its_slot(tmp_path: Path) -> None:
    limits = {"max_websockets_per_key": 1, "websocket_idle_timeout_s": 0.5}
    async with running_app(tmp_path, **limits) as url:
        async with connect(_socket_url(url), additional_headers=_auth(ALICE)) as socket:
            started = time.monotonic()
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(socket.recv(), 5)
            assert closed.value.rcvd.code == 1000
            assert 0.4 < time.monotonic() - started < 3
        # Her one connection's slot is free again: a new one is served.
        async with connect(_socket_url(url), additional_headers=_auth(ALICE)) as socket:
            await socket.send(json.dumps(_create("hello")))
            assert (await _terminal(socket))["type"] == "response.completed"


async def test_a_streaming_response_is_not_idle(tmp_path: Path) -> None:
    async with (
        running_app(tmp_path, websocket_idle_timeout_s=0.3) as url,
        connect(_socket_url(url), additional_headers=_auth(ALICE)) as socket,
    ):
        await socket.send(json.dumps(_create("SDK-SLOW: hold")))
        await _until(socket, "response.reasoning_text.done")  # the engine now pauses
        # Five idle timeouts without a message from either side: the connection stays open.
        deadline = time.monotonic() + 1.5
        with pytest.raises(TimeoutError):
            while True:
                await asyncio.wait_for(socket.recv(), deadline - time.monotonic())


async def test_websocket_input_is_bounded_in_bytes(tmp_path: Path) -> None:
    # A few messages, far fewer than the count bound (16), but more bytes than may wait.
    limits = {"max_body_bytes": 40_000, "max_websocket_pending_bytes": 64_000}
    async with (
        running_app(tmp_path, **limits) as url,
        connect(_socket_url(url), additional_headers=_auth(ALICE)) as socket,
    ):
        await socket.send(json.dumps(_create("SDK-SLOW: hold")))
        await _until(socket, "response.reasoning_text.done")
        for _ in range(4):  # 4 x 30 kB queued behind the paused response
            await socket.send(json.dumps(_create("x" * 30_000)))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(socket.recv(), 5)
        assert closed.value.rcvd.code == 1008


async def test_a_websocket_message_over_the_body_limit_is_a_413_event(tmp_path: Path) -> None:
    async with (
        running_app(tmp_path, max_body_bytes=20_000) as url,
        connect(_socket_url(url), additional_headers=_auth(ALICE)) as socket,
    ):
        await socket.send(json.dumps(_create("x" * 30_000)))
        error = json.loads(await asyncio.wait_for(socket.recv(), 5))
        assert error["type"] == "error" and error["status"] == 413
        assert set(error["error"]) == {"message", "type", "param", "code"}
        # The connection stays open, as after any bad message.
        await socket.send(json.dumps(_create("hello")))
        assert (await _terminal(socket))["type"] == "response.completed"


def _create(text: str) -> dict:
    return {"type": "response.create", "model": MODEL, "input": text, "store": False}


async def _until(socket: ClientConnection, event_type: str) -> dict:
    while (event := json.loads(await asyncio.wait_for(socket.recv(), 10)))["type"] != event_type:
        assert event["type"] != "error", event
    return event


async def _terminal(socket: ClientConnection) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(socket.recv(), 10))
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event


class Trickle:
    """A client sending a request's headers, then one body byte every ``interval_s``, until
    the server answers; what it answered, and whether it then closed the connection."""

    # 0.4 s, not a divisor of the tests' 0.5 s deadline: the server's 408 then arrives between
    # two bytes (0.1 s after one, 0.3 s before the next). On a divisor it arrived as the next
    # byte left, and a byte reaching a closed socket resets the connection, which discards the
    # answer not yet read (a flaky ECONNRESET).
    def __init__(self, url: str, headers: dict[str, str], interval_s: float = 0.4) -> None:
        self.url = httpx.URL(url)
        self.headers = headers
        self.interval_s = interval_s

    async def run(self, within_s: float = 10) -> tuple[int, dict, bool]:
        reader, writer = await asyncio.open_connection(self.url.host, self.url.port)
        head = "POST /v1/responses HTTP/1.1\r\nHost: app\r\nContent-Type: application/json\r\n"
        head += "Content-Length: 100000\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in self.headers.items())
        writer.write(head.encode() + b"\r\n")
        received, closed = b"", False
        deadline = time.monotonic() + within_s
        try:
            while not closed and time.monotonic() < deadline:
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), self.interval_s)
                except TimeoutError:
                    if not received:
                        writer.write(b" ")  # no answer yet: one more byte of the body
                    continue
                received += chunk
                closed = not chunk
        finally:
            writer.close()
        head_bytes, _, body = received.partition(b"\r\n\r\n")
        return int(head_bytes.split()[1]), json.loads(body), closed


@pytest.mark.parametrize("limited", [False, True], ids=["no deadline", "deadline"])
async def test_slow_bodies_are_cut_at_the_deadline(tmp_path: Path, limited: bool) -> None:
    deadline_s = BODY_DEADLINE_S if limited else 1000
    async with running_app(tmp_path, body_timeout_s=deadline_s) as url:
        slow = [asyncio.ensure_future(Trickle(url, _auth(ALICE)).run()) for _ in range(SLOTS)]
        await asyncio.sleep(0.3)  # every slot taken by a body still arriving
        started = time.monotonic()
        served = await _served_in_time(url)
        if limited:
            for status, body, closing in await asyncio.gather(*slow):
                assert status == 408
                assert set(body["error"]) == {"message", "type", "param", "code"}
                assert closing  # the connection is closed, not kept for the rest of the body
        else:
            for trickle in slow:
                trickle.cancel()
            await asyncio.gather(*slow, return_exceptions=True)
    assert served == {"health": limited, "other key": limited}
    if limited:  # freed by the deadline: served about a deadline after the slots filled
        assert time.monotonic() - started < STARVED_AFTER_S


async def test_slow_bodies_without_a_key_hold_no_slot(tmp_path: Path) -> None:
    # No deadline to help: the key, checked on the headers, turns them away at once.
    async with running_app(tmp_path, body_timeout_s=1000) as url:
        answers = await asyncio.gather(*(Trickle(url, {}).run(5) for _ in range(3 * SLOTS)))
        served = await _served_in_time(url)
    for status, body, closing in answers:
        assert status == 401 and body["error"]["type"] == "invalid_request_error"
        assert closing
    assert served == {"health": True, "other key": True}
