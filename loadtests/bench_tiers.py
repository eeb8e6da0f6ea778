"""Service tiers under a flex flood (issue 49, Show): interactive Codex-like turns at
``priority`` while a ``flex`` batch floods the same engines, against the same turns alone.

    PYTHONPATH=. python loadtests/bench_tiers.py
    PYTHONPATH=. python loadtests/bench_tiers.py --sessions 3 --flood 12   # tiny (the unit test)

One run, three scenarios, each on fresh engines: ``alone`` (the interactive turns only),
``flood`` (the same turns, and ``--flood`` flex requests sent at once ``--flood-at-s`` in) and,
for what the tiers buy, ``no tiers`` (the same flood with every request at one tier, no cap: the
engines first come first served, as before issue 49).

The engines are configs/local.yaml's (``--replicas`` of them): the simulated engine with its
options (prefill 20,000 tokens/s in 256-token chunks, 64 decode slots, decode 200 tokens/s, 2%
slower a step for each other request decoding; answers of 256 tokens)
behind the engine deployment's own class (its tier gate: ``service_tiers.max_running``, flex at
most 16 in an engine), in this process, no Ray; the requests are what the ingress makes of them
(``render_request`` and ``engine_request``, each tier's deadline from ``service_tiers``).

- interactive: ``--sessions`` Codex sessions (loadtests/traces.py: its base prompt and tools, a
  tool round a turn, think times between), each conversation on one engine (its routing key's
  hash: affinity, as the router keeps it), every turn sent when the one before ended and its
  think time passed;
- flood: a batch job's requests: one shared instruction of ~1,000 tokens, then a document of
  its own of ~2,000 tokens each, 256 output tokens, spread over the engines.

Time to first token is the engine's own (``engine_ttft_s``: the time model's, arrival at the
replica to the first token), so a loaded host's late timers are not counted; the ingress and
Ray in front are not here (their cost per request does not depend on the tier). The turns
compared are those sent while the flood was in the engines (from its start to the end of its
last request) and the same turns (session, turn) of ``alone``. Flex's wait is from its arrival
at the replica to its first token, wall clock, against its bound: a flex request is passed by
no request arriving more than ``deadline_s[flex] - deadline_s[priority]`` after it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from serve_app.config import AppArgs, ServedTier, ServiceTierArgs
from serve_app.engines.base import GenerateChunk, GenerateRequest
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from serve_app.routing.keys import routing_key
from serve_app.serving.engine.deployment import EngineDeployment
from serve_app.serving.turn.engine_request import engine_request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MODEL, percentile
from traces import WORDS, Session, generate

LOCAL_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "local.yaml"
RENDER_TIME = datetime(2026, 1, 1, tzinfo=UTC)  # one system message for every run
SCENARIOS = ("alone", "flood", "no tiers")
FLOOD_OUTPUT_TOKENS = 256


class _Replica(EngineDeployment.func_or_class):  # type: ignore[name-defined,misc]
    """The engine deployment's class, served without Ray (as its unit tests build it)."""

    def __del__(self) -> None:
        pass


@dataclass(frozen=True)
class Turn:
    session: int
    index: int
    think_s: float
    request: GenerateRequest  # its request id is set at each send


@dataclass
class Served:
    sent: float  # monotonic
    engine_ttft_s: float | None = None
    engine_queue_s: float | None = None
    first_token: float | None = None  # monotonic, when this process got it
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ended: float | None = None
    finish: str | None = None


@dataclass
class Run:
    interactive: dict[tuple[int, int], Served] = field(default_factory=dict)
    flood: list[Served] = field(default_factory=list)
    flood_started: float = 0.0


def local_settings() -> tuple[SimulatedEngineConfig, ServiceTierArgs]:
    """configs/local.yaml's engine options and service tiers, as the app reads them; the
    engine's answers as long as the requests allow (256 tokens: the traces' and the flood's
    max_output_tokens), where the simulated engine's default answer is 64."""
    (app,) = yaml.safe_load(LOCAL_CONFIG.read_text())["applications"]
    args = AppArgs.model_validate(app["args"])
    engine = SimulatedEngineConfig.model_validate(args.engine.options)
    engine = engine.model_copy(update={"default_output_tokens": FLOOD_OUTPUT_TOKENS})
    return engine, args.service_tiers


def _request(body: dict[str, Any], tier: ServedTier, tiers: ServiceTierArgs) -> GenerateRequest:
    request = ResponsesRequest.model_validate({"model": MODEL, **body})
    prompt = render_request(request, now=RENDER_TIME)
    key = routing_key(request.prompt_cache_key, prompt.token_ids, owner=None)
    max_tokens = request.max_output_tokens or FLOOD_OUTPUT_TOKENS
    return engine_request(
        request,
        prompt,
        request_id="",
        max_tokens=max_tokens,
        session_id=key,
        cache_salt=None,
        tier=tier,
        tiers=tiers,
    )


def interactive_turns(
    sessions: Sequence[Session], tier: ServedTier, tiers: ServiceTierArgs
) -> list[list[Turn]]:
    """Each session's turns as the ingress would ask the engine, at ``tier``."""
    rendered = []
    for number, session in enumerate(sessions):
        turns = []
        for index, turn in enumerate(session.turns):
            body = {
                "input": session.turn_input(index),
                "tools": session.tools,
                "prompt_cache_key": session.session_id,
                "max_output_tokens": turn["max_output_tokens"],
            }
            request = _request(body, tier, tiers)
            turns.append(Turn(number, index, turn["think_s"], request))
        rendered.append(turns)
    return rendered


def flood_requests(
    count: int, tier: ServedTier, tiers: ServiceTierArgs, seed: int
) -> list[GenerateRequest]:
    """A batch job's requests: a shared instruction, then a document of each request's own."""
    rng = random.Random(seed)
    instructions = "Summarize the document for the weekly report. " + " ".join(
        rng.choice(WORDS) for _ in range(900)
    )
    requests = []
    for number in range(count):
        document = " ".join(rng.choice(WORDS) for _ in range(1_800))
        body = {
            "instructions": instructions,
            "input": f"Document {number}: {document}",
            "max_output_tokens": FLOOD_OUTPUT_TOKENS,
            "prompt_cache_key": f"batch-{number}",
        }
        requests.append(_request(body, tier, tiers))
    return requests


async def _replicas(count: int, engine: SimulatedEngineConfig, tiers: ServiceTierArgs) -> list[Any]:
    replicas = []
    for index in range(count):
        simulated = SimulatedEngine(engine)
        await simulated.start()
        replica = _Replica.__new__(_Replica)
        replica._serve(simulated, f"engine-{index}", tiers=tiers)
        replicas.append(replica)
    return replicas


async def _chunks(replica: Any, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
    async for item in replica.generate(request):
        if isinstance(item, GenerateChunk):
            yield item


async def _send(replica: Any, request: GenerateRequest) -> Served:
    served = Served(sent=time.monotonic())
    request = replace(request, request_id=uuid.uuid4().hex)
    async for chunk in _chunks(replica, request):
        if chunk.token_ids and served.first_token is None:
            served.first_token = time.monotonic()
            served.engine_ttft_s = chunk.engine_ttft_s
            served.engine_queue_s = chunk.engine_queue_s
            served.prompt_tokens = chunk.num_prompt_tokens
            served.cached_tokens = chunk.num_cached_tokens
        if chunk.finish_reason is not None:
            served.finish = chunk.finish_reason
    served.ended = time.monotonic()
    return served


def _home(request: GenerateRequest, replicas: int) -> int:
    return zlib.crc32((request.session_id or "").encode()) % replicas


async def _session(replicas: list[Any], turns: list[Turn], start_at: float, run: Run) -> None:
    await asyncio.sleep(max(start_at - time.monotonic(), 0))
    for turn in turns:
        await asyncio.sleep(turn.think_s)
        replica = replicas[_home(turn.request, len(replicas))]
        run.interactive[(turn.session, turn.index)] = await _send(replica, turn.request)


async def _flood(replicas: list[Any], requests: list[GenerateRequest], at: float, run: Run) -> None:
    await asyncio.sleep(max(at - time.monotonic(), 0))
    run.flood_started = time.monotonic()
    sends = [
        _send(replicas[number % len(replicas)], request) for number, request in enumerate(requests)
    ]
    run.flood = list(await asyncio.gather(*sends))


async def play(
    scenario: str,
    sessions: Sequence[Session],
    flood: int,
    flood_at_s: float,
    replica_count: int,
    seed: int,
    engine: SimulatedEngineConfig,
    tiers: ServiceTierArgs,
) -> Run:
    if scenario == "no tiers":
        tiers = ServiceTierArgs(max_running={})
    interactive_tier: ServedTier = "default" if scenario == "no tiers" else "priority"
    flood_tier: ServedTier = "default" if scenario == "no tiers" else "flex"
    # Every request rendered before the clock starts: rendering holds the event loop.
    turns = interactive_turns(sessions, interactive_tier, tiers)
    requests = flood_requests(flood, flood_tier, tiers, seed) if scenario != "alone" else []
    replicas = await _replicas(replica_count, engine, tiers)
    run = Run()
    start = time.monotonic()
    tasks = [
        _session(replicas, session_turns, start + session.start_s, run)
        for session, session_turns in zip(sessions, turns, strict=True)
    ]
    if requests:
        tasks.append(_flood(replicas, requests, start + flood_at_s, run))
    try:
        await asyncio.gather(*tasks)
    finally:
        for replica in replicas:
            await replica._engine.shutdown()
    return run


def _ms(values: Sequence[float], share: float) -> str:
    return f"{percentile(values, share) * 1000:.0f}"


def report(runs: dict[str, Run], tiers: ServiceTierArgs) -> str:
    """The table: the interactive turns sent during the flood, in each scenario."""
    flooded = runs["flood"]
    window = (flooded.flood_started, max(served.ended or 0 for served in flooded.flood))
    during = [
        key for key, served in flooded.interactive.items() if window[0] <= served.sent <= window[1]
    ]
    bound_s = tiers.deadline_s["flex"] - tiers.deadline_s["priority"]
    lines = [
        f"interactive turns sent while the flood was in the engines: {len(during)} "
        f"(of {len(flooded.interactive)}); the flood's window: {window[1] - window[0]:.1f} s",
        "",
        "| scenario | turns | TTFT p50 / p90 / p99 (ms) | queue wait p90 (ms) | uncached "
        "tokens mean / p90 | flex done | flex wait p50 / max (s) | flex bound (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, run in runs.items():
        turns = [run.interactive[key] for key in during if key in run.interactive]
        ttfts = [served.engine_ttft_s for served in turns if served.engine_ttft_s is not None]
        queued = [served.engine_queue_s or 0.0 for served in turns]
        uncached = [served.prompt_tokens - served.cached_tokens for served in turns]
        mean_uncached = sum(uncached) / max(len(uncached), 1)
        flex = "-"
        waits = "-"
        if run.flood:
            done = [served for served in run.flood if served.finish in ("stop", "length")]
            flex = f"{len(done)} / {len(run.flood)}"
            first = [s.first_token - s.sent for s in run.flood if s.first_token is not None]
            waits = f"{percentile(first, 0.5):.1f} / {max(first):.1f}"
        lines.append(
            f"| {name} | {len(ttfts)} | {_ms(ttfts, 0.5)} / {_ms(ttfts, 0.9)} / "
            f"{_ms(ttfts, 0.99)} | {_ms(queued, 0.9)} | {mean_uncached:.0f} / "
            f"{percentile(uncached, 0.9):.0f} | {flex} | {waits} | "
            f"{bound_s:.0f} |"
        )
    alone = [runs["alone"].interactive[key].engine_ttft_s for key in during]
    with_flood = [flooded.interactive[key].engine_ttft_s for key in during]
    ratio = percentile([v for v in with_flood if v is not None], 0.9) / percentile(
        [v for v in alone if v is not None], 0.9
    )
    lines += ["", f"TTFT p90 with the flex flood / alone: {ratio:.2f}x (target: within 1.2x)"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--rate", type=float, default=1.0, help="sessions started per second")
    parser.add_argument("--flood", type=int, default=480, help="flex requests in the batch")
    parser.add_argument("--flood-at-s", type=float, default=5.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    # To explore (the shipped values are configs/local.yaml's):
    parser.add_argument("--chunk-tokens", type=int, help="the engine's prefill_chunk_tokens")
    parser.add_argument("--flex-max-running", type=int, help="service_tiers.max_running.flex")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    args = parser.parse_args()
    sessions = generate(args.sessions, args.rate, args.seed)
    engine, tiers = local_settings()
    if args.chunk_tokens is not None:
        engine = engine.model_copy(update={"prefill_chunk_tokens": args.chunk_tokens})
    if args.flex_max_running is not None:
        running = {**tiers.max_running, "flex": args.flex_max_running}
        tiers = tiers.model_copy(update={"max_running": running})
    print(
        f"engines: {args.replicas} x prefill {engine.prefill_tokens_per_s:.0f} tokens/s in "
        f"{engine.prefill_chunk_tokens}-token chunks, {engine.max_num_seqs} decode slots; "
        f"flex at most {tiers.max_running.get('flex')} in an engine; deadlines {tiers.deadline_s}"
    )
    runs: dict[str, Run] = {}
    for scenario in ["alone", *(s for s in args.scenarios if s != "alone")]:
        began = time.monotonic()
        runs[scenario] = asyncio.run(
            play(
                scenario,
                sessions,
                args.flood,
                args.flood_at_s,
                args.replicas,
                args.seed,
                engine,
                tiers,
            )
        )
        print(f"{scenario}: {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    print(report(runs, tiers))


if __name__ == "__main__":
    main()
