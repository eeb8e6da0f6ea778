"""The simulated engine's scheduler (issue 49): waiting prefills by deadline (each request's
arrival plus its ``deadline_s``), then arrival; a prefill in chunks a more urgent one may cut in
between; decode slots handed out in the same order; the queue wait on the first token's chunk.

The times compared are the time model's (arrival plus ``engine_ttft_s``), not how late the
host's timers fired; prefills are slow enough (tenths of a second) that the order in which the
requests are submitted is the order they arrive in."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from serve_app.engines.base import GenerateChunk, GenerateRequest, SamplingSettings
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig

PREFILL = 10_000  # tokens/s
STEP_S = 1 / 1_000


def _prompt(tag: int, tokens: int) -> list[int]:
    """A prompt of ``tokens`` tokens no other prompt shares a block with."""
    return [200006, 1428, 200008, *range(tag * 100_000, tag * 100_000 + tokens - 4), 200007]


@dataclass
class Served:
    request_id: str
    arrived: float  # monotonic, when submitted
    first: GenerateChunk  # the chunk with the first token

    @property
    def first_token_at(self) -> float:
        assert self.first.engine_ttft_s is not None
        return self.arrived + self.first.engine_ttft_s


def _engine(**overrides: object) -> SimulatedEngine:
    config = {
        "prefill_tokens_per_s": PREFILL,
        "decode_tokens_per_s": 1_000,
        "batch_slowdown": 0,
        "default_output_tokens": 8,
        **overrides,
    }
    return SimulatedEngine(SimulatedEngineConfig(**config))


async def _serve(
    sim: SimulatedEngine, request_id: str, tokens: int, deadline_s: float, max_tokens: int = 8
) -> Served:
    request = GenerateRequest(
        request_id,
        _prompt(hash(request_id) % 1000, tokens),
        SamplingSettings(max_tokens),
        deadline_s=deadline_s,
    )
    arrived = time.monotonic()
    first: GenerateChunk | None = None
    async for chunk in sim.generate(request):
        if first is None and chunk.token_ids:
            first = chunk
    assert first is not None
    return Served(request_id, arrived, first)


async def _submit(sim: SimulatedEngine, *requests: tuple[str, int, float]) -> list[Served]:
    """Each (id, prompt tokens, deadline_s) submitted 20 ms after the one before."""
    tasks = []
    for request_id, tokens, deadline_s in requests:
        tasks.append(asyncio.create_task(_serve(sim, request_id, tokens, deadline_s)))
        await asyncio.sleep(0.02)
    return list(await asyncio.wait_for(asyncio.gather(*tasks), timeout=30))


def _order(served: list[Served]) -> list[str]:
    return [one.request_id for one in sorted(served, key=lambda one: one.first_token_at)]


async def test_waiting_prefills_go_earliest_deadline_first() -> None:
    """A long prefill runs; flex, default and priority requests arrive behind it, in that
    order: priority's first token comes first, then default's, then flex's."""
    sim = _engine()
    served = await _submit(
        sim,
        ("running", 3_000, 60.0),  # 0.3 s of prefill: the others queue behind it
        ("flex", 500, 60.0),
        ("default", 500, 5.0),
        ("priority", 500, 0.0),
    )
    assert _order(served) == ["running", "priority", "default", "flex"]


async def test_equal_deadlines_go_in_arrival_order() -> None:
    sim = _engine()
    served = await _submit(sim, ("a", 3_000, 5.0), ("b", 500, 5.0), ("c", 500, 5.0))
    assert _order(served) == ["a", "b", "c"]


async def test_a_waiting_request_ages_ahead_of_later_urgent_ones() -> None:
    """No starvation: priority requests keep the prefill busy; the flex request (deadline 0.3 s)
    is passed by those arriving within 0.3 s of it, never by one arriving later."""
    sim = _engine()
    flex_deadline = 0.3
    submitted = [("head", 2_000, 0.0), ("flex", 500, flex_deadline)]
    # 0.1 s of prefill each, one every 40 ms: more work than the engine does, for a second.
    submitted += [(f"p{index}", 1_000, 0.0) for index in range(25)]
    served = {one.request_id: one for one in await _submit(sim, *submitted)}
    flex = served["flex"]
    passed = [
        one
        for one in served.values()
        if one.request_id.startswith("p") and one.first_token_at < flex.first_token_at
    ]
    assert passed  # the priority requests did go first at first
    assert all(one.arrived <= flex.arrived + flex_deadline + 0.005 for one in passed)
    later = [one for one in served.values() if one.arrived > flex.arrived + flex_deadline + 0.05]
    assert later and all(one.first_token_at > flex.first_token_at for one in later)


async def test_a_chunked_prefill_lets_an_urgent_request_in_between_chunks() -> None:
    """A flex prefill of 1 s: whole, a priority request arriving after its start waits for all
    of it; in chunks of 512 tokens (51 ms here), for the chunk running at most."""
    for chunk_tokens, most_s in [(None, 1.0), (512, 512 / PREFILL)]:
        sim = _engine(prefill_chunk_tokens=chunk_tokens)
        flex, urgent = await _submit(sim, ("flex", 10_000, 60.0), ("urgent", 500, 0.0))
        own_s = (urgent.first.num_prompt_tokens - urgent.first.num_cached_tokens) / PREFILL
        waited = urgent.first.engine_ttft_s - own_s - STEP_S
        assert waited == pytest.approx(urgent.first.engine_queue_s, abs=0.003)
        assert waited <= most_s + 0.003, chunk_tokens
        if chunk_tokens is None:  # it waited out the flex prefill
            flex_prefilled = flex.first_token_at - STEP_S
            assert waited == pytest.approx(flex_prefilled - urgent.arrived, abs=0.005)
        else:  # the flex prefill's chunks resumed once the urgent one was done
            assert flex.first_token_at > urgent.first_token_at


async def test_decode_slots_go_to_the_earliest_deadline_and_are_not_preempted() -> None:
    """One decode slot (vLLM's max_num_seqs): the second and third requests wait for the first
    to finish, then the one due first takes the slot, whatever the order they came in."""
    sim = _engine(max_num_seqs=1, default_output_tokens=200)  # 0.2 s of decode each
    tasks = [asyncio.create_task(_serve(sim, "first", 500, 60.0, max_tokens=200))]
    await asyncio.sleep(0.02)
    tasks.append(asyncio.create_task(_serve(sim, "flex", 500, 60.0, max_tokens=200)))
    await asyncio.sleep(0.02)
    tasks.append(asyncio.create_task(_serve(sim, "priority", 500, 0.0, max_tokens=200)))
    served = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    assert _order(served) == ["first", "priority", "flex"]
    first, _flex, priority = served
    # The slot was held to the end of the first request's decode, not preempted: its 200
    # tokens at a step each (the model's times, however late the host's timers fired).
    first_ended = first.first_token_at + 199 * STEP_S
    assert priority.first.engine_queue_s is not None
    assert priority.arrived + priority.first.engine_queue_s >= first_ended - 0.005
    assert first.first.engine_queue_s == pytest.approx(0.0, abs=0.003)


async def test_the_first_tokens_chunk_says_how_long_the_request_waited() -> None:
    sim = _engine()
    head, behind = await _submit(sim, ("head", 3_000, 5.0), ("behind", 500, 5.0))
    assert head.first.engine_queue_s == pytest.approx(0.0, abs=0.003)
    # It waited for the head's prefill (0.3 s), less the time it came after it.
    head_prefilled = head.first_token_at - STEP_S
    assert behind.first.engine_queue_s == pytest.approx(head_prefilled - behind.arrived, abs=0.005)
    assert head_prefilled - head.arrived == pytest.approx(0.3, abs=0.005)
