"""The engine replica's tier gate (issue 49): at most ``service_tiers.max_running[tier]`` of a
tier's requests in the engine at once, so a flex flood leaves the other tiers decode slots (an
engine admits a waiting request into a full batch only when one leaves: vLLM's max_num_seqs and
KV cache, the simulated engine's max_num_seqs). A request held at the gate enters the engine
with its deadline counted from its arrival at the replica, so it keeps its place in the
deadline order. On the engine deployment's class with the simulated engine, no Ray."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from serve_app.config import ServiceTierArgs
from serve_app.engines.base import GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.protocol.service_tiers import PRIORITY
from serve_app.serving.engine.autoscaling import GENERATING_REQUESTS, tier_metric
from serve_app.serving.engine.deployment import EngineDeployment
from serve_app.serving.engine.tier_gate import TierGate

PROMPT = [200006, 1428, 200008, 12194, 200007]


class _BareReplica(EngineDeployment.func_or_class):  # type: ignore[name-defined,misc]
    def __del__(self) -> None:
        pass


async def _replica(engine: SimulatedEngine, tiers: ServiceTierArgs) -> Any:
    await engine.start()

    async def alive() -> set[str]:
        return {"ingress"}

    bare = _BareReplica.__new__(_BareReplica)
    bare._serve(engine, "engine-1", alive, tiers=tiers)
    return bare


def _request(request_id: str, tier: str, max_tokens: int = 100) -> GenerateRequest:
    return GenerateRequest(
        request_id,
        PROMPT,
        SamplingSettings(max_tokens),
        priority=PRIORITY[tier],  # type: ignore[index]
        deadline_s=ServiceTierArgs().deadline_s[tier],  # type: ignore[index]
    )


async def _first_chunk(replica: Any, request: GenerateRequest) -> GenerateChunk:
    """The chunk holding the request's first token; the rest is drained."""
    first: GenerateChunk | None = None
    async for item in replica.generate(request, caller="ingress"):
        if isinstance(item, GenerateChunk) and item.token_ids and first is None:
            first = item
    assert first is not None
    return first


async def test_a_flex_flood_leaves_the_priority_tier_a_decode_slot() -> None:
    """Two decode slots; flex may hold one. Three flex requests come, then a priority one:
    the priority request finds a slot free at once, where without the gate the flood held
    both until a flex request ended."""
    waits: dict[bool, float] = {}
    for gated in (False, True):
        config = SimulatedEngineConfig(
            max_num_seqs=2, decode_tokens_per_s=500, batch_slowdown=0, default_output_tokens=100
        )
        tiers = ServiceTierArgs(max_running={"flex": 1} if gated else {})
        replica = await _replica(SimulatedEngine(config), tiers)
        flood = [
            asyncio.create_task(_first_chunk(replica, _request(f"flex-{index}", "flex")))
            for index in range(3)
        ]
        await asyncio.sleep(0.05)
        urgent = await _first_chunk(replica, _request("urgent", "priority"))
        assert urgent.engine_queue_s is not None
        waits[gated] = urgent.engine_queue_s
        await asyncio.gather(*flood)
        await replica._engine.shutdown()
    assert waits[True] == pytest.approx(0.0, abs=0.005)
    # 100 tokens at 500/s: the first flex request held its slot about 0.2 s from its start,
    # 0.05 s before the priority one came.
    assert waits[False] > 0.1


async def test_a_request_held_at_the_gate_keeps_its_deadline_from_arrival() -> None:
    gate = TierGate({"flex": 1})
    held: list[GenerateRequest] = []

    async def run(request: GenerateRequest, hold_s: float) -> None:
        async with gate.admitted(request) as admitted:
            held.append(admitted)
            await asyncio.sleep(hold_s)

    first = asyncio.create_task(run(_request("a", "flex"), 0.2))
    await asyncio.sleep(0)
    second = asyncio.create_task(run(_request("b", "flex"), 0))
    urgent = asyncio.create_task(run(_request("c", "priority"), 0))
    await asyncio.sleep(0.05)
    assert [request.request_id for request in held] == ["a", "c"]  # c is not gated
    assert gate.waiting() == 1
    await asyncio.gather(first, second, urgent)
    admitted_b = held[-1]
    assert admitted_b.request_id == "b"
    # It waited about 0.2 s at the gate: its deadline in the engine is that much nearer.
    assert 60.0 - 0.3 < admitted_b.deadline_s < 60.0 - 0.15
    assert gate.waiting() == 0


async def test_gated_requests_count_as_generating_for_the_autoscaling_policy() -> None:
    """A request held at the gate is load: the total counts it, and so does its tier (which a
    policy told to leave flex out subtracts)."""
    config = SimulatedEngineConfig(decode_tokens_per_s=50)
    replica = await _replica(SimulatedEngine(config), ServiceTierArgs(max_running={"flex": 1}))

    async def drain(stream: AsyncIterator[Any]) -> None:
        async for _ in stream:
            pass

    calls = [
        asyncio.create_task(drain(replica.generate(_request(f"f{index}", "flex"), "ingress")))
        for index in range(3)
    ]
    deadline = time.monotonic() + 5
    while replica._engine.num_ongoing_requests() < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    stats = await replica.record_autoscaling_stats()
    assert stats[GENERATING_REQUESTS] == 3 and stats[tier_metric("flex")] == 3
    assert replica._engine.num_ongoing_requests() == 1
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    await replica._engine.shutdown()


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_running"):
        ServiceTierArgs(max_running={"flex": 0})
