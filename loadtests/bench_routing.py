"""Routing benchmark: which engine replica each Codex turn lands on, and what that costs.

Replays one multi-turn Codex-like trace (loadtests/traces.py) against the engine deployment
with the simulated engine, once per request router, on the same replica count:

- ``ray-pow2``: Ray Serve's default router (power of two choices on queue length);
- ``ray-consistent-hash``: Ray's experimental ``ConsistentHashRouter`` on ``session_id``;
- ``ray-prefix-aware``: Ray Serve LLM's ``PrefixCacheAffinityRouter``, made to see the prompt
  (it matches text; here each prompt token id becomes one character, so it matches tokens);
- ``serve_app-mbN``: ours (``serve_app.routing.router.PrefixAffinityRouter``, bounded load,
  ``min_bound`` N; several with ``--min-bound 16 8``) as placed before issue 32, and
  ``serve_app-mbN-ttftS``: ours placing by predicted time to first token, slack S
  (``--ttft-slack-s``);
- ``oracle``: one infinite prefix cache and no queueing (an upper bound, computed, not run).

The trace is replayed through the deployment's handle, exactly as the ingress calls it (same
prompts rendered with harmony, same routing key), so the numbers are the router's and the
simulated engine's, not HTTP's. One replica is added at 60% of the arrivals and one removed at
80%, or once the added one has served ``--serve-added-s`` (10 s), whichever is later, to count
the sessions whose replica changes. For policies over several traces without
Ray's noise, see ``sim_routing.py``. Printed per router:

- hit rate: prompt tokens served from the prefix cache / prompt tokens (token-weighted), any
  tier; loaded / pulled: the shares of prompt tokens the replicas loaded from their CPU tier
  and pulled from the shared tier (``--kv-tier``; on Ray the shared tier is one actor per app,
  ``serve_app/engines/simulated/shared_tier.py``);
- TTFT p50/p90: from the request reaching its engine replica to its first token, that is the
  simulated engine's time model (prefills of uncached tokens serialized in arrival order, then
  one decode step) as the replica lived it;
- caller TTFT p90: the same as the caller sees it, with Ray's routing and transport added (on a
  2-core machine running nine replicas this is mostly CPU contention, and noisy);
- max/mean work: engine seconds per replica by the time model (uncached prompt tokens at the
  prefill rate, loaded and pulled ones at their rates, output tokens at the decode rate), for
  turns begun before the replica is
  added: the load each router gave each replica;
- max/mean busy: request-seconds per replica (wall clock, as the caller saw them) over the same
  turns; on 2 cores a busier replica process is also slower per request, which inflates this;
- moved: share of consecutive turns of a session on different replicas, away from scaling;
- remap +1 / -1: share of sessions active across a scale event whose replica changed.

    python loadtests/bench_routing.py --min-bound 16 8  # ~15 minutes on 2 cores
    python loadtests/bench_routing.py --sessions 40  # a quick look
    python loadtests/bench_routing.py --served-out served/  # also every turn, as JSON lines

This is a benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
    PrefixCacheAffinityRouter,
)
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest

from serve_app.config import EngineConfig
from serve_app.engines.base import GenerateRequest
from serve_app.engines.prefix_cache import PrefixKVCache
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.engines.simulated.shared_tier import remove_stores
from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from serve_app.routing.affinity import DEFAULT_NEW_LOAD_FACTOR, DEFAULT_SPILL_FACTOR
from serve_app.routing.keys import routing_key
from serve_app.routing.ring import DEFAULT_LOAD_FACTOR, DEFAULT_MIN_BOUND
from serve_app.routing.ttft import DEFAULT_TTFT_SLACK_S
from serve_app.serving.engine.client import HandleEngineClient
from serve_app.serving.engine.deployment import EngineDeployment
from serve_app.serving.turn.engine_request import engine_request

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from sim_tiers import TierConfig
from traces import Session, generate

MODEL = "gpt-oss-120b"
RENDER_TIME = datetime(2026, 1, 1, tzinfo=UTC)  # the same system message on every replay
# Prompt token ids as characters for Ray's text-matching router: private-use plane and up,
# clear of the surrogates, one character per token.
TOKEN_CHAR_BASE = 0xE000


class TokenPrefixCacheAffinityRouter(PrefixCacheAffinityRouter):
    """Ray Serve LLM's prefix-aware router, shown our requests' token ids as text."""

    def _extract_text_from_request(self, pending_request: PendingRequest) -> str:
        request = pending_request.args[0]
        return "".join(chr(TOKEN_CHAR_BASE + token) for token in request.prompt_token_ids)


ROUTERS: dict[str, RequestRouterConfig | None] = {
    "ray-pow2": None,
    "ray-consistent-hash": RequestRouterConfig(
        request_router_class="ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"
    ),
    "ray-prefix-aware": RequestRouterConfig(request_router_class=TokenPrefixCacheAffinityRouter),
    "serve_app": None,  # one run per --min-bound value, named serve_app-mbN
}


@dataclass(frozen=True)
class Turn:
    session_id: str
    index: int
    token_ids: list[int]
    max_output_tokens: int
    routing_key: str
    # The engine request the app would send for this turn (its request id left to each send).
    generate: GenerateRequest


@dataclass
class Served:
    turn: Turn
    started: float
    first_token: float
    engine_ttft_s: float
    ended: float
    replica: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    # Of cached_tokens, those loaded from the replica's CPU tier and pulled from the shared one.
    loaded_tokens: int = 0
    pulled_tokens: int = 0


@dataclass
class ScaleEvent:
    name: str  # "+1" or "-1"
    began: float
    done: float


def render_turns(session: Session) -> list[Turn]:
    turns = []
    for index, turn in enumerate(session.turns):
        body = {
            "model": MODEL,
            "input": session.turn_input(index),
            "tools": session.tools,
            "prompt_cache_key": session.session_id,
        }
        request = ResponsesRequest.model_validate(body)
        prompt = render_request(request, now=RENDER_TIME)
        # One tenant (an open API): the traces' keys, unsalted.
        key = routing_key(request.prompt_cache_key, prompt.token_ids, owner=None)
        max_tokens = turn["max_output_tokens"]
        generate = engine_request(
            request, prompt, request_id="", max_tokens=max_tokens, session_id=key, cache_salt=None
        )
        turns.append(Turn(session.session_id, index, prompt.token_ids, max_tokens, key, generate))
    return turns


def app_name(router_name: str) -> str:
    # One app name per router: a process keeps one router per deployment, so reusing a name
    # would route a later replay with the first replay's router.
    return f"routing-bench-{router_name}"


def deploy(name: str, replicas: int, engine: EngineConfig):
    options: dict[str, Any] = {
        "num_replicas": replicas,
        "max_ongoing_requests": 64,
        "ray_actor_options": {"num_cpus": 0.01},
    }
    if ROUTERS[name] is not None:
        options["request_router_config"] = ROUTERS[name]
    deployment = EngineDeployment.options(**options)
    # A fixed code version, so a later call changing only num_replicas is a light update that
    # keeps the running replicas, as a config deploy is. serve.run otherwise draws a random
    # version each call and replaces them all. (Private attribute: Serve has no public one.)
    deployment._version = "routing-bench"
    return serve.run(deployment.bind(engine), name=app_name(name), route_prefix=None)


async def serve_turn(client: HandleEngineClient, turn: Turn) -> Served:
    request = replace(turn.generate, request_id=f"bench-{uuid.uuid4().hex}")
    started = time.monotonic()
    first_token = engine_ttft_s = 0.0
    replica, prompt_tokens, cached_tokens, output_tokens = "", 0, 0, 0
    loaded_tokens = pulled_tokens = 0
    async for chunk in client.stream(request):
        output_tokens += len(chunk.token_ids)
        replica = replica or chunk.replica or ""
        prompt_tokens = chunk.num_prompt_tokens or prompt_tokens
        cached_tokens = max(cached_tokens, chunk.num_cached_tokens)
        loaded_tokens = max(loaded_tokens, chunk.num_loaded_tokens)
        pulled_tokens = max(pulled_tokens, chunk.num_pulled_tokens)
        if chunk.token_ids and not first_token:
            first_token = time.monotonic()
            engine_ttft_s = chunk.engine_ttft_s or 0.0
        if chunk.error:
            raise RuntimeError(chunk.error)
    return Served(
        turn,
        started,
        first_token,
        engine_ttft_s,
        time.monotonic(),
        replica,
        prompt_tokens,
        cached_tokens,
        output_tokens,
        loaded_tokens,
        pulled_tokens,
    )


async def play_session(
    client: HandleEngineClient,
    session: Session,
    turns: list[Turn],
    t0: float,
    time_scale: float,
    served: list[Served],
) -> None:
    await asyncio.sleep(max(0.0, t0 + session.start_s * time_scale - time.monotonic()))
    for trace_turn, turn in zip(session.turns, turns, strict=True):
        await asyncio.sleep(trace_turn["think_s"] * time_scale)
        served.append(await serve_turn(client, turn))


async def scale_mid_run(
    name: str,
    replicas: int,
    engine: EngineConfig,
    t0: float,
    at_s: tuple[float, float],
    serve_added_s: float,
    events: list[ScaleEvent],
) -> None:
    """One replica added at ``at_s[0]`` seconds into the run, one removed at ``at_s[1]`` but
    not before the added one has been up ``serve_added_s``: a replica's start-up takes 13 to
    25 s on two cores, and Ray stopped the newest replica in every run, so without the wait
    the added replica was removed as soon as it was up, having served a few turns at most."""
    for event_name, when, count in (("+1", at_s[0], replicas + 1), ("-1", at_s[1], replicas)):
        if events:  # the removal
            when = max(when, events[-1].done - t0 + serve_added_s)
        await asyncio.sleep(max(0.0, t0 + when - time.monotonic()))
        began = time.monotonic()
        # serve.run with only num_replicas changed is a light update: other replicas stay.
        await asyncio.to_thread(deploy, name, count, engine)
        events.append(ScaleEvent(event_name, began, time.monotonic()))


async def replay(
    name: str,
    sessions: list[Session],
    rendered: dict[str, list[Turn]],
    args: argparse.Namespace,
    engine: EngineConfig,
) -> tuple[list[Served], list[ScaleEvent]]:
    handle = deploy(name, args.replicas, engine)
    client = HandleEngineClient(handle)
    served: list[Served] = []
    events: list[ScaleEvent] = []
    arrivals_s = sessions[-1].start_s * args.time_scale
    t0 = time.monotonic()
    scaling = asyncio.create_task(
        scale_mid_run(
            name,
            args.replicas,
            engine,
            t0,
            (0.6 * arrivals_s, 0.8 * arrivals_s),
            args.serve_added_s,
            events,
        )
    )
    await asyncio.gather(
        *(
            play_session(client, s, rendered[s.session_id], t0, args.time_scale, served)
            for s in sessions
        )
    )
    await scaling
    serve.delete(app_name(name))
    remove_stores(app_name(name))  # its shared KV tier's actor, if any (detached)
    return served, events


# ---------------------------------------------------------------------------------------------
# Figures


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def hit_rate(served: list[Served]) -> float:
    return sum(s.cached_tokens for s in served) / sum(s.prompt_tokens for s in served)


def tier_hits(served: list[Served]) -> tuple[float, float]:
    """Shares of prompt tokens loaded from a CPU tier and pulled from the shared tier."""
    prompt = sum(s.prompt_tokens for s in served)
    return (
        sum(s.loaded_tokens for s in served) / prompt,
        sum(s.pulled_tokens for s in served) / prompt,
    )


def load_imbalance(served: list[Served], until: float, load: Callable[[Served], float]) -> float:
    """Max over mean of ``load`` summed per replica, for turns begun before ``until``."""
    per_replica: Counter[str] = Counter()
    for s in served:
        if s.started < until:
            per_replica[s.replica] += load(s)
    return max(per_replica.values()) / statistics.mean(per_replica.values())


def work_seconds(engine: SimulatedEngineConfig) -> Callable[[Served], float]:
    """A turn's engine time by the time model: its uncached prefill, its tiers' loads and
    pulls, and its decode."""

    def work(s: Served) -> float:
        prefill = (s.prompt_tokens - s.cached_tokens) / engine.prefill_tokens_per_s
        transfers = (
            s.loaded_tokens / engine.kv_load_tokens_per_s
            + s.pulled_tokens / engine.shared_kv_pull_tokens_per_s
        )
        return prefill + transfers + s.output_tokens / engine.decode_tokens_per_s

    return work


def wall_seconds(s: Served) -> float:
    return s.ended - s.started


def by_session(served: list[Served]) -> dict[str, list[Served]]:
    sessions: dict[str, list[Served]] = defaultdict(list)
    for s in sorted(served, key=lambda s: s.started):
        sessions[s.turn.session_id].append(s)
    return sessions


def moved_share(served: list[Served], events: list[ScaleEvent], settle_s: float) -> float:
    """Consecutive turns of a session on different replicas, neither near a scale event."""

    def near_event(s: Served) -> bool:
        return any(e.began - settle_s <= s.started <= e.done + settle_s for e in events)

    pairs = moved = 0
    for turns in by_session(served).values():
        for before, after in itertools.pairwise(turns):
            if near_event(before) or near_event(after):
                continue
            pairs += 1
            moved += before.replica != after.replica
    return moved / pairs if pairs else float("nan")


def remap_share(served: list[Served], event: ScaleEvent, settle_s: float) -> float:
    """Sessions with a turn before the event and one after it settled: replica changed?"""
    changed = total = 0
    for turns in by_session(served).values():
        before = [s for s in turns if s.started < event.began]
        after = [s for s in turns if s.started > event.done + settle_s]
        if before and after:
            total += 1
            changed += before[-1].replica != after[0].replica
    return changed / total if total else float("nan")


def oracle(
    sessions: list[Session], rendered: dict[str, list[Turn]], engine: SimulatedEngineConfig
) -> tuple[float, list[float]]:
    """Hit rate and TTFTs with one infinite prefix cache and no queueing (an upper bound)."""
    schedule = []
    for session in sessions:
        clock = session.start_s
        for trace_turn, turn in zip(session.turns, rendered[session.session_id], strict=True):
            clock += trace_turn["think_s"]
            schedule.append((clock, turn))
    cache = PrefixKVCache(engine.block_size, capacity_tokens=10**12)
    prompt = cached = 0
    ttfts = []
    for _, turn in sorted(schedule, key=lambda entry: entry[0]):
        hit = cache.lookup(turn.token_ids)
        cache.insert(turn.token_ids)
        prompt += len(turn.token_ids)
        cached += hit
        uncached_s = (len(turn.token_ids) - hit) / engine.prefill_tokens_per_s
        ttfts.append(uncached_s + 1 / engine.decode_tokens_per_s)
    return cached / prompt, ttfts


def row(name: str, values: list[str]) -> str:
    return f"| {name} | " + " | ".join(values) + " |"


def report(
    results: dict[str, tuple[list[Served], list[ScaleEvent]]],
    sessions: list[Session],
    rendered: dict[str, list[Turn]],
    engine: SimulatedEngineConfig,
    args: argparse.Namespace,
) -> None:
    columns = [
        "hit rate",
        "loaded",
        "pulled",
        "TTFT p50 (ms)",
        "TTFT p90 (ms)",
        "TTFT p90 before +1 (ms)",
        "caller TTFT p90 (ms)",
        "max/mean work",
        "max/mean busy",
        "moved",
        "remap +1",
        "remap -1",
    ]
    print()
    print(row("router", columns))
    print(row("---", ["---:"] * len(columns)))
    settle = args.settle_s
    for name, (served, events) in results.items():
        ttfts = [s.engine_ttft_s * 1000 for s in served]
        caller_ttfts = [(s.first_token - s.started) * 1000 for s in served]
        added, removed = events
        # Before any scale event: the steady state that sim_routing replays.
        steady = [s.engine_ttft_s * 1000 for s in served if s.started < added.began]
        loaded, pulled = tier_hits(served)
        print(
            row(
                name,
                [
                    f"{hit_rate(served):.3f}",
                    f"{loaded:.1%}",
                    f"{pulled:.1%}",
                    f"{statistics.median(ttfts):.0f}",
                    f"{percentile(ttfts, 0.9):.0f}",
                    f"{percentile(steady, 0.9):.0f}",
                    f"{percentile(caller_ttfts, 0.9):.0f}",
                    f"{load_imbalance(served, added.began, work_seconds(engine)):.2f}",
                    f"{load_imbalance(served, added.began, wall_seconds):.2f}",
                    f"{moved_share(served, events, settle):.2f}",
                    f"{remap_share(served, added, settle):.2f}",
                    f"{remap_share(served, removed, settle):.2f}",
                ],
            )
        )
    best_hit, best_ttfts = oracle(sessions, rendered, engine)
    ttfts = [t * 1000 for t in best_ttfts]
    print(
        row(
            "oracle",
            [
                f"{best_hit:.3f}",
                "-",
                "-",
                f"{statistics.median(ttfts):.0f}",
                f"{percentile(ttfts, 0.9):.0f}",
                "-",
                "-",
                "-",
                "-",
                "0.00",
                "-",
                "-",
            ],
        )
    )
    turns = sum(len(session.turns) for session in sessions)
    tokens = sum(len(turn.token_ids) for turns_ in rendered.values() for turn in turns_)
    print(
        f"\n{len(sessions)} sessions, {turns} turns, {tokens / turns:.0f} prompt tokens per turn "
        f"on average; {args.replicas} replicas (+1 at 60% of arrivals, -1 at 80% or "
        f"{args.serve_added_s:.0f} s after the +1 is up); simulated "
        f"engine: prefill {engine.prefill_tokens_per_s:.0f} tokens/s (serialized), decode "
        f"{engine.decode_tokens_per_s:.0f} tokens/s, prefix cache {engine.kv_cache_tokens} "
        f"tokens in blocks of {engine.block_size}, LRU; time scale {args.time_scale}; "
        f"serve_app-mbN: load_factor {args.load_factor}, new_load_factor "
        f"{args.new_load_factor}, spill_factor {args.spill_factor}, min_bound N"
    )


def add_placer_options(parser: argparse.ArgumentParser) -> None:
    """Our router's placer options (each run of ``--min-bound``), shared with sim_routing.py."""
    parser.add_argument("--load-factor", type=float, default=DEFAULT_LOAD_FACTOR, help="ours")
    parser.add_argument(
        "--new-load-factor",
        type=float,
        default=DEFAULT_NEW_LOAD_FACTOR,
        help="ours; 0 turns balanced placement off",
    )
    parser.add_argument("--spill-factor", type=float, default=DEFAULT_SPILL_FACTOR, help="ours")
    parser.add_argument(
        "--min-bound", type=int, nargs="+", default=[DEFAULT_MIN_BOUND], help="ours, each"
    )
    parser.add_argument(
        "--ttft-slack-s",
        type=float,
        nargs="+",
        default=[-1.0, DEFAULT_TTFT_SLACK_S],
        help="ours, each: placement by predicted TTFT with this slack; -1 is today's placer "
        "(by the ring and the load bounds only)",
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rate", type=float, default=5.0, help="sessions started per second")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--time-scale", type=float, default=1.0, help="on arrivals and thinks")
    parser.add_argument("--settle-s", type=float, default=2.0, help="after a scale event")
    parser.add_argument(
        "--serve-added-s",
        type=float,
        default=10.0,
        help="the added replica serves at least this long before one is removed",
    )
    parser.add_argument("--routers", nargs="+", choices=list(ROUTERS), default=list(ROUTERS))
    parser.add_argument("--prefill-tokens-per-s", type=float, default=20_000)
    parser.add_argument("--decode-tokens-per-s", type=float, default=200)
    parser.add_argument("--kv-cache-tokens", type=int, default=262_144)
    parser.add_argument(
        "--kv-tier",
        choices=["none", "cpu", "shared"],
        default="none",
        help="the simulated engines' tiers behind their GPU cache, sized and priced as "
        "sim_routing.py's (loadtests/sim_tiers.py)",
    )
    add_placer_options(parser)
    parser.add_argument(
        "--served-out", type=Path, help="a directory: every served turn, ROUTER.jsonl"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    routers = [name for name in args.routers if name != "serve_app"]
    tiers = TierConfig.scaled(args.kv_tier, args.kv_cache_tokens, args.prefill_tokens_per_s)
    # Ours is told the shared tier's pull rate (the replicas report their CPU load rate).
    tier_kwargs = (
        {"shared_kv_pull_tokens_per_s": tiers.pull_tokens_per_s} if tiers.kind == "shared" else {}
    )
    if "serve_app" in args.routers:
        for min_bound, slack in itertools.product(args.min_bound, args.ttft_slack_s):
            # serve_app-mbN: today's placer; serve_app-mbN-ttftS: by predicted TTFT, slack S.
            routers.append(f"serve_app-mb{min_bound}" + ("" if slack < 0 else f"-ttft{slack}"))
            ROUTERS[routers[-1]] = RequestRouterConfig(
                request_router_class="serve_app.routing.router.PrefixAffinityRouter",
                request_router_kwargs={
                    "load_factor": args.load_factor,
                    "new_load_factor": args.new_load_factor or None,
                    "spill_factor": args.spill_factor,
                    "min_bound": min_bound,
                    "ttft_slack_s": None if slack < 0 else slack,
                    **tier_kwargs,
                },
                # As in the configs: the replicas report every second.
                request_routing_stats_period_s=1.0,
            )
    simulated = SimulatedEngineConfig(
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_tokens_per_s=args.decode_tokens_per_s,
        kv_cache_tokens=args.kv_cache_tokens,
        **engine_tiers(tiers, args.replicas),
    )
    engine = EngineConfig(kind="simulated", options=simulated.model_dump(exclude={"script"}))
    sessions = generate(args.sessions, args.rate, args.seed)
    rendered = {session.session_id: render_turns(session) for session in sessions}
    ray.init(include_dashboard=False, logging_level="ERROR")
    serve.start()
    results = {}
    try:
        for name in routers:
            print(f"replaying with {name} ...", flush=True)
            results[name] = asyncio.run(replay(name, sessions, rendered, args, engine))
    finally:
        serve.shutdown()
        ray.shutdown()
    report(results, sessions, rendered, simulated, args)
    if args.served_out:
        write_served(results, args.served_out)


def engine_tiers(tiers: TierConfig, replicas: int) -> dict[str, float]:
    """The simulated engine's tier options for ``tiers`` (none: its defaults, no tier)."""
    if tiers.kind == "none":
        return {}
    options: dict[str, float] = {
        "cpu_kv_cache_tokens": tiers.cpu_tokens,
        "kv_load_tokens_per_s": tiers.load_tokens_per_s,
    }
    if tiers.kind == "shared":
        # As large as the replicas' CPU tiers together, as in the replay.
        options["shared_kv_cache_tokens"] = replicas * tiers.cpu_tokens
        options["shared_kv_pull_tokens_per_s"] = tiers.pull_tokens_per_s
    return options


def write_served(
    results: dict[str, tuple[list[Served], list[ScaleEvent]]], directory: Path
) -> None:
    """Every served turn and scale event per router, one JSON object per line, for analyses
    the table does not make (times in seconds from the first turn's start)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, (served, events) in results.items():
        t0 = min(s.started for s in served)
        with (directory / f"{name}.jsonl").open("w") as out:
            for event in events:
                record = {"event": event.name, "began": event.began - t0, "done": event.done - t0}
                out.write(json.dumps(record) + "\n")
            for s in sorted(served, key=lambda s: s.started):
                record = {
                    "session": s.turn.session_id,
                    "turn": s.turn.index,
                    "started": s.started - t0,
                    "replica": s.replica,
                    "engine_ttft_s": s.engine_ttft_s,
                    "caller_ttft_s": s.first_token - s.started,
                    "ended": s.ended - t0,
                    "prompt_tokens": s.prompt_tokens,
                    "cached_tokens": s.cached_tokens,
                    "loaded_tokens": s.loaded_tokens,
                    "pulled_tokens": s.pulled_tokens,
                    "output_tokens": s.output_tokens,
                }
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
