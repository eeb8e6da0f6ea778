"""The engine replica's load pushed over its channels (serve_app.serving.engine.channel): the
`Outbox`'s push rule, and both ends for real (the engine deployment's class, `HandleEngineClient`,
a `PrefixAffinityRouter` on an event loop of its own, as Ray runs it) joined by test_channel.py's
stand-in for Ray's streamed handle calls. No Ray."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve_app.engines.base import GenerateChunk
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.routing import local_routers, metrics
from serve_app.routing.prefill import DECODING_KEY, QUEUED_KEY
from serve_app.routing.router import PrefixAffinityRouter
from serve_app.serving.engine import client as engine_client
from serve_app.serving.engine.channel import ChannelSend, Outbox
from serve_app.serving.engine.client import HandleEngineClient
from tests.unit.routing.test_router import StandInReplica, make_router, pending, route
from tests.unit.serving.engine.test_channel import (
    CALLER,
    _BareReplica,
    _channel_open,
    _Handle,
    _Recording,
    _request,
    _tokens,
)

WINDOW_S = 0.2  # long enough that "at once" and "at the window's end" cannot be confused


class _Versions:
    """A load that says how many times it changed: a send carries the version as of then."""

    def __init__(self) -> None:
        self.version = 0

    def __call__(self) -> dict[str, Any]:
        return {"version": self.version}

    def change(self, outbox: Outbox) -> None:
        self.version += 1
        outbox.load_changed()


@contextlib.asynccontextmanager
async def _sending(outbox: Outbox) -> AsyncIterator[asyncio.Queue[tuple[float, ChannelSend]]]:
    """The outbox's sends, each with the loop time it went out, as they come."""
    loop = asyncio.get_running_loop()
    sent: asyncio.Queue[tuple[float, ChannelSend]] = asyncio.Queue()

    async def read() -> None:
        async for send in outbox.sends():
            sent.put_nowait((loop.time(), send))

    reader = asyncio.create_task(read())
    try:
        yield sent
    finally:
        outbox.close()
        await reader


def _busy(outbox: Outbox) -> None:
    """A request rides the channel: it stays open (not idle)."""
    outbox.requests["r"] = asyncio.create_task(asyncio.sleep(3600))


async def test_a_load_change_after_a_quiet_window_goes_out_at_once() -> None:
    load = _Versions()
    outbox = Outbox(WINDOW_S, idle_s=10, heartbeat_s=10, load=load)
    _busy(outbox)
    async with _sending(outbox) as sent:
        await asyncio.sleep(0.01)
        started = asyncio.get_running_loop().time()
        load.change(outbox)
        at, send = await asyncio.wait_for(sent.get(), 5)
        assert at - started < WINDOW_S / 4
        assert send == ChannelSend([], {"version": 1})


async def test_load_changes_within_a_window_go_out_once_at_its_end_as_of_then() -> None:
    load = _Versions()
    outbox = Outbox(WINDOW_S, idle_s=10, heartbeat_s=10, load=load)
    _busy(outbox)
    async with _sending(outbox) as sent:
        load.change(outbox)
        first_at, _ = await asyncio.wait_for(sent.get(), 5)
        for _ in range(5):  # within the window that send opened
            load.change(outbox)
            await asyncio.sleep(WINDOW_S / 20)
        at, send = await asyncio.wait_for(sent.get(), 5)
        assert at - first_at >= WINDOW_S * 0.95
        assert send.load == {"version": 6}  # the latest: as of the send, not of the change
        await asyncio.sleep(WINDOW_S * 1.5)
        assert sent.empty()  # one send for the five changes


async def test_chunks_and_heartbeats_carry_the_load() -> None:
    load = _Versions()
    outbox = Outbox(0, idle_s=10, heartbeat_s=0.05, load=load)
    _busy(outbox)
    async with _sending(outbox) as sent:
        load.version = 3  # changed without telling: carried all the same
        outbox.put("r", GenerateChunk(token_ids=[1]))
        _, send = await asyncio.wait_for(sent.get(), 5)
        assert [(rid, chunk.token_ids) for rid, chunk in send.batch] == [("r", [1])]
        assert send.load == {"version": 3}
        load.version = 4
        _, heartbeat = await asyncio.wait_for(sent.get(), 5)
        assert heartbeat == ChannelSend([], {"version": 4})


async def test_without_a_load_a_heartbeat_is_an_empty_send_and_changes_send_nothing() -> None:
    outbox = Outbox(0, idle_s=10, heartbeat_s=0.2)
    _busy(outbox)
    async with _sending(outbox) as sent:
        started = asyncio.get_running_loop().time()
        outbox.load_changed()
        at, send = await asyncio.wait_for(sent.get(), 5)
        assert send == ChannelSend([], None)
        assert at - started >= 0.15  # the heartbeat, not a push


async def test_a_channel_only_the_load_keeps_busy_closes_when_idle() -> None:
    """No request of its caller rides it: other callers' turns change the load every few
    milliseconds, and still it closes after ``idle_s`` (its caller reopens it when needed)."""
    load = _Versions()
    outbox = Outbox(0.005, idle_s=0.2, heartbeat_s=0.05, load=load)
    sends = []

    async def read() -> None:
        async for send in outbox.sends():
            sends.append(send)

    reader = asyncio.create_task(read())
    for _ in range(200):
        if reader.done():
            break
        load.change(outbox)
        await asyncio.sleep(0.005)
    assert reader.done(), "the channel stayed open on load changes alone"
    assert any(send.load for send in sends)


@dataclass(frozen=True)
class _Step:
    kind: str  # "put", "urgent" (a first token) or "load"
    request: int
    sleep_ms: int


steps = st.builds(
    _Step,
    kind=st.sampled_from(["put", "urgent", "load", "load"]),
    request=st.integers(0, 2),
    sleep_ms=st.sampled_from([0, 0, 1, 3, 7]),
)


@settings(
    max_examples=min(settings().max_examples, 200),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(script=st.lists(steps, min_size=1, max_size=30), window_s=st.sampled_from([0.002, 0.01]))
async def test_puts_and_load_changes_interleaved_lose_nothing_and_keep_the_pacing(
    script: list[_Step], window_s: float
) -> None:
    """Chunks, first tokens and load changes in any order and spacing: every chunk goes out
    once, in order; every send carries the load as of then, never older than the one before;
    the last change goes out (none is lost); a send holding no first token is at least a
    window after the one before."""
    load = _Versions()
    outbox = Outbox(window_s, idle_s=10, heartbeat_s=10, load=load)
    _busy(outbox)
    put: dict[str, list[int]] = {}
    async with _sending(outbox) as sent:
        for index, step in enumerate(script):
            request_id = f"r{step.request}"
            if step.kind == "load":
                load.change(outbox)
            else:
                put.setdefault(request_id, []).append(index)
                chunk = GenerateChunk(token_ids=[index])
                outbox.put(request_id, chunk, urgent=step.kind == "urgent")
            if step.sleep_ms:
                await asyncio.sleep(step.sleep_ms / 1000)
        await asyncio.sleep(window_s * 3 + 0.02)
        sends = []
        while not sent.empty():
            sends.append(sent.get_nowait())
    got: dict[str, list[int]] = {}
    for _, send in sends:
        for request_id, chunk in send.batch:
            got.setdefault(request_id, []).extend(chunk.token_ids)
    assert got == put
    versions = [send.load["version"] for _, send in sends]
    assert versions == sorted(versions)
    if load.version:
        assert versions and versions[-1] == load.version, (versions, load.version)
    urgent_ids = {index for index, step in enumerate(script) if step.kind == "urgent"}
    for (before, _), (at, send) in itertools.pairwise(sends):
        tokens = {token for _, chunk in send.batch for token in chunk.token_ids}
        if not tokens & urgent_ids:
            assert at - before >= window_s * 0.9, (at - before, send)


# --- both ends: a replica's load reaches every ingress's routers -----------------------------


class _RouterThread:
    """A `PrefixAffinityRouter` on an event loop of its own thread, as Ray runs a handle's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.router: PrefixAffinityRouter = self.run(self._make())

    @staticmethod
    async def _make() -> PrefixAffinityRouter:
        return make_router(use_pushed_loads=True)

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class _Recorder:
    """A router that keeps every load handed to it, with the thread that handed it."""

    report_wait_s = 0.0
    wants_loads = True

    def __init__(self) -> None:
        self.loads: list[tuple[str, dict[str, Any], int]] = []

    def placement_reported(self, key: str) -> bool:
        return True

    def push_load(self, replica: str, load: Any) -> None:
        self.loads.append((replica, dict(load), threading.get_ident()))


@contextlib.contextmanager
def _router_thread() -> Iterator[_RouterThread]:
    routers = _RouterThread()
    try:
        yield routers
    finally:
        routers.stop()


async def _one_replica_two_ingresses() -> tuple[Any, HandleEngineClient, HandleEngineClient]:
    """An engine replica (the deployment's class, a simulated engine) and two ingress replicas'
    clients: the first streams its requests on their own (no channel), the second opens one."""
    engine = _Recording(SimulatedEngineConfig(decode_tokens_per_s=200, default_output_tokens=20))
    await engine.start()

    async def both_alive() -> set[str]:
        return {CALLER, "ingress-2"}

    replica = _BareReplica.__new__(_BareReplica)
    replica._serve(engine, "engine-1", both_alive, caller_check_period_s=0.1)
    first = HandleEngineClient(_Handle(replica), caller=CALLER, channels=False)
    second = HandleEngineClient(_Handle(replica), caller="ingress-2")
    return replica, first, second


async def test_a_replica_pushes_its_load_to_every_ingress_router_and_they_apply_it() -> None:
    """Two ingress replicas (two clients, each its caller name) use one engine replica; only
    the first sends turns (on their own streams: it opens no channel), the second holds a
    channel. The second's routers see those turns' prefill and decoding as they happen, under
    the id their placer knows the replica by, and a router on its own event loop applies the
    latest load at its next choice."""
    replica, first, second = await _one_replica_two_ingresses()
    recorder = _Recorder()
    with _router_thread() as routers:
        router = routers.router

        async def reported() -> None:  # the replica's routing-stats report, as Ray hands it on
            router.update_replicas(
                [StandInReplica(replica.replica_id(), replica._reporter.report())]
            )

        routers.run(reported())
        applied_before = metrics.PUSHED_LOADS.labels("applied").value
        try:
            await _tokens(second, _request("open", 2))
            await _channel_open(second)
            await asyncio.sleep(0.05)  # the open request's last push
            local_routers.register(recorder)
            turns = [_tokens(first, _request(f"turn-{index}", 20)) for index in range(3)]
            await asyncio.gather(*turns)
            await asyncio.sleep(0.1)  # the last ends' push: one window
            mine = threading.get_ident()
            loads = [load for name, load, thread in recorder.loads if name == "engine-1"]
            assert all(thread == mine for _, _, thread in recorder.loads)  # the ingress's loop
            assert any(load[QUEUED_KEY] > 0 for load in loads), loads  # turns waiting
            assert any(load[DECODING_KEY] >= 2 for load in loads), loads  # turns decoding
            assert (loads[-1][QUEUED_KEY], loads[-1][DECODING_KEY]) == (0, 0)
            assert not first._channels and replica._outboxes.keys() == {"ingress-2"}

            async def choose() -> Any:  # on the router's loop, as Ray routes
                return await route(router, pending("next", later_turn=False))

            routers.run(choose())
            assert metrics.PUSHED_LOADS.labels("applied").value > applied_before
            latest = router._placer.predictor._pushes["engine-1"]
            assert (latest[QUEUED_KEY], latest[DECODING_KEY]) == (0, 0)
        finally:
            for outbox in list(replica._outboxes.values()):
                outbox.close()
            for client in (first, second):
                for reader in list(client._channels.values()):
                    await reader
            await replica._engine.shutdown()


async def test_no_load_rides_a_channel_no_router_of_its_ingress_places_by(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Routers place by pushed loads only where configured (``use_pushed_loads``): an ingress
    whose routers do not opens its channels without loads, and the replica sends none on them
    (no item for a load nobody reads); its tokens ride as before."""
    monkeypatch.setattr(engine_client, "wants_loads", lambda: False)
    replica, first, second = await _one_replica_two_ingresses()
    recorder = _Recorder()
    local_routers.register(recorder)
    try:
        await _tokens(second, _request("open", 2))
        await _channel_open(second)
        await asyncio.gather(*(_tokens(first, _request(f"turn-{i}", 20)) for i in range(3)))
        chunks = await _tokens(second, _request("more", 5))  # tokens ride as before
        assert sum(len(chunk.token_ids) for chunk in chunks) == 5
        await asyncio.sleep(0.1)
        assert replica._outboxes.keys() == {"ingress-2"}
        assert recorder.loads == []
    finally:
        for outbox in list(replica._outboxes.values()):
            outbox.close()
        for reader in list(second._channels.values()):
            await reader
        await replica._engine.shutdown()
