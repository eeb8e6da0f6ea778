"""How the router's costs grow with the replicas, by simulation: loadtests/sim_routing.py's replay
(its engines' time model, its prefix caches, the real `ConversationPlacer` of every ingress
replica) at 8, 64 and 256 engine replicas with 2, 8 and 32 ingress replicas, the load
proportional to the engine replicas (sessions and their arrival rate scaled alike).

What the replay here adds to sim_routing.py's, to be what a router on Ray receives:

- **Reports as Ray delivers them.** Each engine replica makes its routing-stats report every
  ``--report-period`` (1 s), its first at a random phase (Ray jitters them); Serve's controller,
  every control loop (0.1 s), broadcasts every replica's latest stats to every router when any
  changed (`ray/serve/_private`: a `RunningReplicaInfo` per replica, its stats inside), and each
  router then runs ``set_reports`` on all of them (``PrefixAffinityRouter.update_replicas``).
  A later turn that reaches a router that does not know its conversation waits for the
  broadcast after its replica's next report, as the request router waits.
- **Pushed loads on open channels only.** An engine replica pushes its load to an ingress
  replica over the channel that ingress holds to it, open while that ingress sent it a request
  within ``channel_idle_s`` (2 s): a push reaches only those routers (`sim_push.LoadPushes`
  schedules them; the deployment's 20 ms window).
- **Turns without harmony.** Every turn's prompt is the Codex base prompt as the app renders it
  (one render, shared by all) and then the session's items as token ids of their own (about 1.3
  tokens a word), built when the replay reads the turn: a 256-replica trace would not fit in
  memory rendered.

Per scale it prints, for each ingress replica (the mean over them): its router's CPU (process
time, this process) per placement (``ConversationPlacer.choose``) and per second of the replay
(placements, ``set_reports`` on each broadcast, pushes applied); the messages it received per
second (broadcasts, the replica reports they carry, pushes); the memory of its tables (the
placer's table of homes, the directory merged from the reports, the TTFT predictor's state:
``sys.getsizeof`` over what it references); and TTFT p90 against the oracle's (one infinite
cache, no queueing). Then how each grows from the smallest scale, beside the replicas' growth.

The trace here is shorter than the study's (``--sessions-per-replica``), so each replica reports
the conversations of a minute, not of ``idle_s`` (300 s): ``--steady`` also times
``set_reports`` on reports as large as a steady state makes them (each replica reporting every
conversation it served in 300 s at this arrival rate).

    PYTHONPATH=. python loadtests/sim_scale.py                  # 8/2, 64/8, 256/32
    PYTHONPATH=. python loadtests/sim_scale.py --scales 8:2 64:8 --seeds 7 1
    PYTHONPATH=. python loadtests/sim_scale.py --steady-only    # the reports' merging alone

(``PYTHONPATH=.``: this checkout's serve_app; a script's ``sys.path`` starts at loadtests/, so
without it the one an environment installed is timed.)
"""

from __future__ import annotations

import argparse
import gc
import itertools
import pickle
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_routing import oracle, percentile, render_turns
from sim_push import Load
from sim_routing import Ours, Replay, SimClock
from traces import Session, generate

from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.routing.affinity import ConversationPlacer
from serve_app.routing.directory import (
    DEFAULT_IDLE_S,
    REPORT_KEY,
    REPORTED_AT_KEY,
    TTL_KEY,
    ConversationDirectory,
)
from serve_app.routing.prefill import QUEUED_KEY

CONTROL_LOOP_S = 0.1  # Serve's controller loop (RAY_SERVE_CONTROL_LOOP_INTERVAL_S)
CHANNEL_IDLE_S = 2.0  # an ingress replica's channel to an engine replica closes this idle
TOKENS_PER_WORD = 1.3
ITEM_OVERHEAD = 8  # a message's or call's harmony header and end, in tokens


# --- turns without harmony ---------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """What the replay reads of a turn (bench_routing.Turn without the engine request)."""

    session_id: str
    index: int
    token_ids: list[int]
    routing_key: str


def item_tokens(item: Mapping[str, Any]) -> int:
    """About how many tokens harmony renders ``item`` into."""
    if item["type"] == "message":
        text = " ".join(part.get("text", "") for part in item["content"])
    elif item["type"] == "function_call":
        text = item["arguments"]
    else:
        text = item.get("output", "")
    return ITEM_OVERHEAD + int(len(text.split()) * TOKENS_PER_WORD)


class SyntheticTurns(Mapping[str, "SessionTurns"]):
    """Each session's turns, built when read: the shared base, then token ids of the session's
    own (a range of its own per session: no two sessions share a block past the base)."""

    def __init__(self, sessions: list[Session], base: list[int]) -> None:
        self.base = base
        self.sessions = {
            session.session_id: (index, session) for index, session in enumerate(sessions)
        }

    def __getitem__(self, session_id: str) -> SessionTurns:
        index, session = self.sessions[session_id]
        return SessionTurns(session, self.base, 300_000 + index * 1_000_000)

    def __iter__(self) -> Iterator[str]:
        return iter(self.sessions)

    def __len__(self) -> int:
        return len(self.sessions)


class SessionTurns:
    def __init__(self, session: Session, base: list[int], first_id: int) -> None:
        self.session, self.base, self.first_id = session, base, first_id
        # Tokens each turn adds (its new items; the first turn's developer message is the base).
        self.added = []
        for turn_index, turn in enumerate(session.turns):
            items = turn["new_items"][1:] if turn_index == 0 else turn["new_items"]
            self.added.append(sum(item_tokens(item) for item in items))

    def __getitem__(self, turn_index: int) -> Turn:
        own = sum(self.added[: turn_index + 1])
        tokens = [*self.base, *range(self.first_id, self.first_id + own)]
        return Turn(self.session.session_id, turn_index, tokens, self.session.session_id)

    def __len__(self) -> int:
        return len(self.added)

    def __iter__(self) -> Iterator[Turn]:
        return (self[index] for index in range(len(self)))


def codex_base() -> list[int]:
    """The prompt every Codex session starts with, as the app renders it: the common prefix of
    two sessions' first turns."""
    first, second = (render_turns(session)[0].token_ids for session in generate(2, 1.0, 99, 1, 1))
    shared = next(
        (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
        min(len(first), len(second)),
    )
    return first[:shared]


# --- the router as Ray feeds it ----------------------------------------------------------------


def deep_size(root: Any, skip: tuple[type, ...] = ()) -> int:
    """Bytes of ``root`` and everything it references (each object once; modules, types,
    functions and instances of ``skip`` not followed)."""
    seen: set[int] = set()
    pending = [root]
    total = 0
    ignored = (type, type(sys), type(deep_size), *skip)
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, ignored):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        pending.extend(gc.get_referents(obj))
    return total


class FromScratchPlacer(ConversationPlacer):
    """The placer as it was: every delivery merged from every report
    (`ConversationDirectory.from_reports`), the recent homes read from all of them."""

    def set_reports(self, reports: Mapping[str, Mapping[str, Any]]) -> None:
        self.set_directory(ConversationDirectory.from_reports(reports, self.table.horizon()))
        self.predictor.update(reports)


class TimedPlacer(ConversationPlacer):
    """The placer with its CPU counted: placements, report handling, pushes applied."""

    def __init__(self, from_scratch: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.from_scratch = from_scratch
        self.choose_s = self.reports_s = self.pushes_s = 0.0
        self.placements = self.broadcasts = self.reports_received = self.pushes_received = 0

    def choose(self, *args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return super().choose(*args, **kwargs)
        finally:
            self.choose_s += time.process_time() - started
            self.placements += 1

    def set_reports(self, reports: Mapping[str, Mapping[str, Any]]) -> None:
        started = time.process_time()
        if self.from_scratch:
            FromScratchPlacer.set_reports(self, reports)
        else:
            super().set_reports(reports)
        self.reports_s += time.process_time() - started
        self.broadcasts += 1
        self.reports_received += len(reports)

    def push(self, replica: str, load: Load) -> None:
        started = time.process_time()
        self.predictor.pushed(replica, load)
        self.pushes_s += time.process_time() - started
        self.pushes_received += 1


class RayFed(Ours):
    """`Ours` with reports broadcast as Serve's controller does and loads pushed on open
    channels only (the module's docstring)."""

    def __init__(
        self,
        members: list[str],
        ingress_replicas: int,
        report_period_s: float,
        push_latency_s: float,
        push_window_s: float,
        seed: int,
        from_scratch: bool = False,
        **bounds: Any,
    ) -> None:
        super().__init__(
            members,
            ingress_replicas=ingress_replicas,
            report_period_s=report_period_s,
            push_latency_s=push_latency_s,
            push_window_s=push_window_s,
            **bounds,
        )
        self.placers = [
            TimedPlacer(from_scratch, clock=self.clock, **bounds) for _ in range(ingress_replicas)
        ]
        for placer in self.placers:
            placer.set_members(members)
        rng = random.Random(seed)
        # Each replica's next report, at a random phase of the period.
        self.next_reports = {m: rng.uniform(0, report_period_s) for m in members}
        self.latest: dict[str, dict[str, Any]] = {}
        self.next_tick = 0.0
        self.changed = False
        self.served_last: dict[str, str] = {}  # conversation -> the replica that served it last
        self.channels: dict[tuple[int, str], float] = {}  # (router, replica) -> last request
        self.current: TimedPlacer | None = None

    def __call__(self, key: str, loads: Mapping[str, int], now: float, tokens: int) -> str:
        self._catch_up(now)
        placer = self.waiting.pop(key, None) or self.rng.choice(self.placers)
        choice = placer.choose(key, loads, tokens)
        assert choice is not None
        self.served_last[key] = choice.replica
        self.channels[self.placers.index(placer), choice.replica] = now
        return choice.replica

    def ready_at(self, key: str, now: float) -> float:
        """Now, if the router the turn reaches knows the conversation; else the broadcast after
        the next report of the replica that served it last (which names it)."""
        self._catch_up(now)
        placer = self.rng.choice(self.placers)
        if placer.knows(key):
            return now
        self.waiting[key] = placer
        replica = self.served_last.get(key)
        if replica is None:
            return now
        reported = self.next_reports[replica]
        return (reported // CONTROL_LOOP_S + 1) * CONTROL_LOOP_S

    def _catch_up(self, now: float) -> None:
        self.clock.now = now
        while self.next_tick <= now:
            tick = self.next_tick
            for replica, due in self.next_reports.items():
                while due <= tick:
                    self.clock.now = due
                    self.latest[replica] = self.reporters[replica].report()
                    due += self.report_period_s
                    self.changed = True
                self.next_reports[replica] = due
            if self.changed:
                self.clock.now = tick
                for placer in self.placers:
                    placer.set_reports(self.latest)
                self.changed = False
            self.next_tick = tick + CONTROL_LOOP_S
        self.clock.now = now

    def _deliver_at(self, replica: str, load: Load, at: float) -> None:
        self.clock.now = at
        for index, placer in enumerate(self.placers):
            if at - self.channels.get((index, replica), float("-inf")) <= CHANNEL_IDLE_S:
                placer.push(replica, load)

    def report_bytes(self) -> int:
        """One broadcast's replica stats, pickled (what each router unpickles)."""
        return len(pickle.dumps(self.latest, protocol=5))


# traces.generate's sessions: 3 to 12 turns, evenly.
MEAN_TURNS = 7.5

# --- one scale ---------------------------------------------------------------------------------


@dataclass
class Scale:
    replicas: int
    ingress: int
    seed: int
    sessions: int
    turns: int
    seconds: float  # the replay's simulated time
    choose_us: float  # per placement, mean over routers
    router_cpu_per_s: float  # per router: placements + reports + pushes, CPU s per replay s
    reports_cpu_per_s: float
    broadcasts_per_s: float
    reports_per_s: float  # replica reports received per router per second
    pushes_per_s: float
    report_kb: float  # one broadcast's stats, pickled
    table_kb: float  # one router's placer, deep size
    conversations: int  # homes in one router's table and directory together (mean)
    ttft_p90_ms: float
    oracle_p90_ms: float
    hit_rate: float
    oracle_hit: float

    @property
    def ttft_ratio(self) -> float:
        return self.ttft_p90_ms / self.oracle_p90_ms


def run_scale(
    replicas: int, ingress: int, seed: int, args: argparse.Namespace, base: list[int]
) -> Scale:
    sessions = generate(
        round(args.sessions_per_replica * replicas), args.rate_per_replica * replicas, seed
    )
    turns = SyntheticTurns(sessions, base)
    engine = SimulatedEngineConfig(
        prefill_tokens_per_s=args.prefill_tokens_per_s, kv_cache_tokens=args.kv_cache_tokens
    )
    members = [f"replica-{index}" for index in range(replicas)]
    policy = RayFed(
        members,
        ingress_replicas=ingress,
        report_period_s=args.report_period,
        push_latency_s=args.push_latency_s,
        push_window_s=0.02,
        seed=seed,
        from_scratch=args.from_scratch,
        ttft_slack_s=0.05,
    )
    started = sessions[0].start_s
    result = Replay(sessions, turns, policy, members, engine, args.output_tokens).run()
    seconds = max(policy.clock.now - started, 1e-9)
    best_hit, best = oracle(sessions, turns, engine)
    placers = policy.placers
    choose_us = statistics.mean(p.choose_s / max(p.placements, 1) for p in placers) * 1e6
    cpu = statistics.mean(p.choose_s + p.reports_s + p.pushes_s for p in placers) / seconds
    table = statistics.mean(deep_size(p, (SimClock,)) for p in placers[:4]) / 1e3
    homes = statistics.mean(len(p.table) + len(p.directory.homes) for p in placers[:4])
    return Scale(
        replicas,
        ingress,
        seed,
        len(sessions),
        sum(len(s.turns) for s in sessions),
        seconds,
        choose_us,
        cpu,
        statistics.mean(p.reports_s for p in placers) / seconds,
        statistics.mean(p.broadcasts for p in placers) / seconds,
        statistics.mean(p.reports_received for p in placers) / seconds,
        statistics.mean(p.pushes_received for p in placers) / seconds,
        policy.report_bytes() / 1e3,
        table,
        round(homes),
        percentile(result.ttfts_ms, 0.9),
        percentile([t * 1000 for t in best], 0.9),
        result.hit_rate,
        best_hit,
    )


def steady_reports_ms(
    replicas: int,
    conversations: int,
    from_scratch: bool,
    served_per_s: float | None = None,
    deliveries: int = 20,
) -> float:
    """CPU ms of one delivery of every replica's stats to a router (``set_reports``) in a
    steady state: each replica reporting ``conversations`` (every one it served within
    ``idle_s``, most with the app's default 30-minute ttl), one in ten replicas with a new report
    since the last delivery (reports every second, deliveries every 0.1 s); the mean over
    ``deliveries`` after a first whole one. A new report is the replica's previous one with the
    turns of the second since (``served_per_s``: that many conversations served again, a tenth
    of them new ones in place of the oldest); None: every conversation in it is new (the bound)."""
    clock = SimClock()
    clock.now = 1_000_000.0
    rng = random.Random(0)
    latest: dict[int, dict[int, float]] = {}

    def report(replica: int) -> dict[str, Any]:
        seen = latest.get(replica)
        if seen is None or served_per_s is None:
            seen = {
                rng.getrandbits(63): clock.now - rng.uniform(0, DEFAULT_IDLE_S)
                for _ in range(conversations)
            }
        else:
            seen = dict(seen)
            served = round(served_per_s)
            for conversation in rng.sample(list(seen), served - served // 10):
                del seen[conversation]  # served again: last now
                seen[conversation] = clock.now
            for conversation in list(seen)[: served // 10]:  # the oldest give way to new ones
                del seen[conversation]
                seen[rng.getrandbits(63)] = clock.now
        latest[replica] = seen
        return {
            REPORTED_AT_KEY: clock.now,
            REPORT_KEY: seen,
            TTL_KEY: {1800.0: [c for c in seen if c % 10]},
            QUEUED_KEY: 0,
        }

    reports = {f"replica-{r}": report(r) for r in range(replicas)}
    placer = (FromScratchPlacer if from_scratch else ConversationPlacer)(clock=clock)
    placer.set_members(reports)
    placer.set_reports(reports)
    gc.collect()  # not this process's earlier garbage (a replay's), collected on our time
    spent = 0.0
    for delivery in range(deliveries):
        clock.now += CONTROL_LOOP_S
        for r in range(delivery % 10, replicas, 10):
            reports[f"replica-{r}"] = report(r)
        reports = dict(reports)  # Serve hands a new mapping, the unchanged stats in it
        started = time.process_time()
        placer.set_reports(reports)
        spent += time.process_time() - started
    return spent / deliveries * 1e3


# --- the report --------------------------------------------------------------------------------


def table(scales: list[Scale]) -> str:
    head = (
        "| engine / ingress replicas | sessions, turns | CPU per placement (µs) | router CPU "
        "(% of a core) | of which reports | broadcasts/s | replica reports/s | pushes/s "
        "| broadcast (kB) | tables (kB) | homes | TTFT p90 / oracle (ms) | ratio |"
    )
    lines = [
        head,
        "| --- |" + " ---: |" * 12,
    ]
    for s in scales:
        lines.append(
            f"| {s.replicas} / {s.ingress} (seed {s.seed}) | {s.sessions:,}, {s.turns:,} "
            f"| {s.choose_us:.0f} | {s.router_cpu_per_s * 100:.1f} "
            f"| {s.reports_cpu_per_s * 100:.1f} "
            f"| {s.broadcasts_per_s:.1f} | {s.reports_per_s:,.0f} | {s.pushes_per_s:,.0f} "
            f"| {s.report_kb:,.0f} | {s.table_kb:,.0f} | {s.conversations:,} "
            f"| {s.ttft_p90_ms:.0f} / {s.oracle_p90_ms:.0f} | {s.ttft_ratio:.2f} |"
        )
    return "\n".join(lines)


def growth(scales: list[Scale]) -> str:
    """Each figure's growth from the smallest scale (means over seeds), beside the replicas'."""
    by_replicas: dict[int, list[Scale]] = {}
    for s in scales:
        by_replicas.setdefault(s.replicas, []).append(s)
    sizes = sorted(by_replicas)
    figures: dict[str, Callable[[Scale], float]] = {
        "CPU per placement": lambda s: s.choose_us,
        "router CPU per second": lambda s: s.router_cpu_per_s,
        "report messages (replica reports/s)": lambda s: s.reports_per_s,
        "pushes/s": lambda s: s.pushes_per_s,
        "tables (bytes)": lambda s: s.table_kb,
        "TTFT p90 / oracle": lambda s: s.ttft_ratio,
    }
    mean = {
        name: {n: statistics.mean(f(s) for s in by_replicas[n]) for n in sizes}
        for name, f in figures.items()
    }
    first = sizes[0]
    lines = [
        "| figure | " + " | ".join(f"{n} replicas" for n in sizes[1:]) + " |",
        "| --- | " + " | ".join("---:" for _ in sizes[1:]) + " |",
        "| replicas | " + " | ".join(f"{n / first:.0f}x" for n in sizes[1:]) + " |",
    ]
    for name, values in mean.items():
        cells = [f"{values[n] / values[first]:.2f}x" if values[first] else "-" for n in sizes[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scales",
        nargs="+",
        default=["8:2", "64:8", "256:32"],
        help="engine:ingress replicas, each a run",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[7])
    parser.add_argument("--sessions-per-replica", type=float, default=12.5)
    parser.add_argument("--rate-per-replica", type=float, default=0.625, help="sessions/s")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--prefill-tokens-per-s", type=float, default=20_000)
    parser.add_argument("--kv-cache-tokens", type=int, default=262_144)
    parser.add_argument("--report-period", type=float, default=1.0)
    parser.add_argument("--push-latency-s", type=float, default=0.005)
    parser.add_argument("--steady", action="store_true", help="also time steady-state reports")
    parser.add_argument(
        "--steady-only", action="store_true", help="time steady-state reports, no replay"
    )
    parser.add_argument(
        "--from-scratch",
        action="store_true",
        help="the routers merge every report on each delivery, as before DirectoryMerger",
    )
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    base = codex_base()
    scales = []
    for spec, seed in itertools.product([] if args.steady_only else args.scales, args.seeds):
        replicas, ingress = (int(part) for part in spec.split(":"))
        started = time.monotonic()
        scales.append(run_scale(replicas, ingress, seed, args, base))
        print(
            f"{replicas} / {ingress} seed {seed}: {time.monotonic() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    if scales:
        print(table(scales))
        print()
        print(growth(scales))
    if args.steady or args.steady_only:
        conversations = round(args.rate_per_replica * DEFAULT_IDLE_S)
        served = args.rate_per_replica * MEAN_TURNS
        print(
            f"\nsteady state: one delivery of every replica's stats to a router, each reporting "
            f"{conversations} conversations (every session of {DEFAULT_IDLE_S:.0f} s at "
            f"{args.rate_per_replica}/s a replica), a tenth of the reports new since the last "
            f"delivery, each with the turns of a second ({served:.1f} at {MEAN_TURNS} turns a "
            f"session), or as the bound every conversation in it new; CPU ms a delivery, and the "
            f"share of a core at {1 / CONTROL_LOOP_S:.0f} a second:\n"
        )
        print(
            "| engine replicas | merged from every report | merged from the new ones "
            "(a second's turns) | merged from the new ones (every conversation new) |"
        )
        print("| ---: | ---: | ---: | ---: |")
        for spec in args.scales:
            replicas = int(spec.split(":")[0])
            cells = []
            for from_scratch, per_s in ((True, served), (False, served), (False, None)):
                ms = steady_reports_ms(replicas, conversations, from_scratch, per_s)
                cells.append(f"{ms:.2f} ms, {ms / 1000 / CONTROL_LOOP_S:.1%}")
            print(f"| {replicas} | " + " | ".join(cells) + " |")
    print(
        f"\n{args.sessions_per_replica} sessions and {args.rate_per_replica} sessions/s per "
        f"engine replica, {args.output_tokens} output tokens a turn, prefill "
        f"{args.prefill_tokens_per_s:.0f} tokens/s, {args.kv_cache_tokens:,}-token caches; "
        f"reports every {args.report_period} s (each replica at its own phase), broadcast at "
        f"most every {CONTROL_LOOP_S} s; loads pushed {args.push_latency_s} s late on channels "
        f"open within {CHANNEL_IDLE_S} s; the Codex base prompt {len(base):,} tokens"
    )


if __name__ == "__main__":
    main()
