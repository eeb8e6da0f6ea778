"""Routing policies replayed in simulated time: several traces in a minute, no Ray, no noise.

`bench_routing.py` runs Ray's real routers against real replicas, so its figures carry the
scheduling noise of nine processes on two cores, and one pass takes a quarter of an hour. This
replays the same traces (same generator, same harmony rendering, same prefix-cache model) through
the same time model as the simulated engine, event by event, for several seeds:

- each replica prefills uncached prompt tokens one request at a time in arrival order, then
  decodes ``--output-tokens`` at the decode rate, slowed by ``batch_slowdown`` per other request;
- the routing policy sees ongoing requests per replica when a turn arrives;
- max/mean work is engine seconds per replica by that model (uncached prefill plus decode),
  over the whole replay.

Policies: ``hash`` (ring owner only: what Ray's ``ConsistentHashRouter`` does), ``pow2``
(power of two choices on ongoing requests: Ray's default), ``ours`` (the
``ConversationPlacer`` the request router runs, with the given bounds, one per ingress replica,
fed the replicas' routing-stats reports every ``--report-period``; a later turn reaching a
placer that does not know its conversation is placed at the next round of reports, as the
request router waits, and its TTFT counts from then, as the engine's does) and the oracle. No
scale events and no router overheads here: those are what the Ray benchmark is for.
``--push-latency-s L`` adds the replicas' pushed load (``sim_push.py``): each change of a
replica's prefill queue pushed to every placer by the deployment's rule (at once, or at the
end of ``--push-window-s`` after the push before), reaching it L seconds later; the placers
apply it as the request router does (``TTFTPredictor.pushed``).

For analysis, not deployable: ``--clairvoyant-slack-s S`` adds today's placer with each later
turn moved to any replica whose true TTFT (its real prefill queue and prefix cache, which no
router sees) is lower by more than S: what moving turns away from queues could gain with
perfect knowledge. ``--max-batched-tokens B`` (with ``--long-prefill-tokens T``) steps each
replica's prefill as vLLM's chunked prefill does (``sim_steps.py``) instead of one at a time,
and ``--by-uncached`` takes waiting prefills fewest uncached tokens first (vLLM's ``priority``
policy; alone, one at a time in that order): what engine scheduling could gain.
``--warm-second-home`` (with either) also prefills each turn's prompt, once the turn ends, at
the lowest priority on a second replica (the home it left, or the least loaded other one), so
two replicas hold each conversation: what holding prefixes twice could gain, and cost.
``--trace-out F`` writes every turn of every policy and seed as a JSON line
(its replica, whether it is a conversation's first turn, stayed home or moved, its prompt and
cached tokens, its wait for the prefills ahead and its TTFT), to see which turns make the tail.

    python loadtests/sim_routing.py --seeds 7 1 2 3 4
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_routing import Turn, add_placer_options, oracle, percentile, render_turns, row
from sim_push import Load, LoadPushes
from sim_steps import SteppedPrefill
from sim_tiers import KV_TIERS, Served, TierConfig, peek, serve, shared_tier, tiered_cache
from traces import Session, generate

from serve_app.engines.prefix_cache import PrefixKVCache
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.routing.affinity import (
    ConversationPlacer,
)
from serve_app.routing.replica_report import ReplicaReporter
from serve_app.routing.ring import HashRing

# (routing key, ongoing requests per replica, simulated time, prompt tokens) -> replica
Policy = Callable[[str, Mapping[str, int], float, int], str]
_WAITED = "waited"  # marks an arrival event put back until a round of reports


@dataclass(frozen=True)
class Result:
    hit_rate: float
    ttfts_ms: list[float]
    imbalance: float  # max/mean engine work per replica, as bench_routing's "work"
    prefill_busy: float  # share of the replay a replica spends prefilling (its serialized part)
    waited: float  # share of turns that waited for a round of reports (ours only)
    tier_hits: float = 0.0  # share of prompt tokens loaded or pulled from a KV tier


@dataclass(frozen=True)
class EngineSteps:
    """The engine's prefill stepped as vLLM's chunked prefill (`sim_steps`), not one at a time."""

    max_batched_tokens: int
    long_prefill_tokens: int
    by_uncached: bool  # vLLM's `priority` policy fed each request's uncached tokens


def hash_owner(members: list[str]) -> Policy:
    ring = HashRing(members)
    return lambda key, _loads, _now, _tokens: ring.owner(key) or members[0]


def power_of_two(members: list[str], seed: int = 0) -> Policy:
    rng = random.Random(seed)

    def choose(_key: str, loads: Mapping[str, int], _now: float, _tokens: int) -> str:
        first, second = rng.sample(members, 2)
        return first if loads[first] <= loads[second] else second

    return choose


class SimClock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class Ours:
    """The request router as deployed: one placer per ingress replica (each has its own
    router), every turn through one of them at random (Serve's proxy spreads requests over
    ingress replicas), and the engine replicas' routing-stats reports delivered to every placer
    each ``report_period_s``, as Ray Serve's controller does."""

    def __init__(
        self,
        members: list[str],
        ingress_replicas: int = 1,
        report_period_s: float = 1.0,
        kv_load_tokens_per_s: float | None = None,
        push_latency_s: float | None = None,
        push_window_s: float = 0.02,
        **bounds: float | None,
    ) -> None:
        self.clock = SimClock()
        self.placers = [
            ConversationPlacer(clock=self.clock, **bounds) for _ in range(ingress_replicas)
        ]
        for placer in self.placers:
            placer.set_members(members)
        # Each replica's reports, as the engine deployment makes them: its KV-cache summary is
        # fed by its cache model's events (`replay` wires them), its prefill ledger by `replay`.
        self.reporters = {
            member: ReplicaReporter(member, self.clock, kv_load_tokens_per_s) for member in members
        }
        self.report_period_s = report_period_s
        self.next_report_s = 0.0
        self.rng = random.Random(0)
        # Later turns waiting for a round of reports, by key: the placer they reached.
        self.waiting: dict[str, ConversationPlacer] = {}
        # Each replica's prefill load pushed to every placer as it changes (None: reports only).
        self.pushes = (
            None
            if push_latency_s is None
            else LoadPushes(push_latency_s, push_window_s, self._load_at, self._deliver_at)
        )

    def __call__(self, key: str, loads: Mapping[str, int], now: float, tokens: int) -> str:
        self._catch_up(now)
        placer = self.waiting.pop(key, None) or self.rng.choice(self.placers)
        choice = placer.choose(key, loads, tokens)
        assert choice is not None
        return choice.replica

    def ready_at(self, key: str, now: float) -> float:
        """When a later turn of conversation ``key`` is placed: now, unless the ingress replica
        it reached does not know the conversation; then at the next round of reports, as the
        request router waits (``serve_app.routing.router``)."""
        self._catch_up(now)
        placer = self.rng.choice(self.placers)
        if placer.knows(key):
            return now
        self.waiting[key] = placer
        return self.next_report_s

    def _catch_up(self, now: float) -> None:
        self.clock.now = now
        if now >= self.next_report_s:
            # Nothing was served since the period's boundary, so reporting now is reporting then.
            self._report()
            self.next_report_s = (now // self.report_period_s + 1) * self.report_period_s

    def _report(self) -> None:
        reports = {member: reporter.report() for member, reporter in self.reporters.items()}
        for placer in self.placers:
            placer.set_reports(reports)

    def _load_at(self, replica: str, at: float) -> Load:
        self.clock.now = at  # the replica's clock when it takes the load
        return self.reporters[replica].load()

    def _deliver_at(self, replica: str, load: Load, at: float) -> None:
        self.clock.now = at
        for placer in self.placers:
            placer.predictor.pushed(replica, load)


@dataclass
class TrueState:
    """What the replay knows and no router does: each replica's prefix cache and when its
    prefill queue frees, and the arriving turn's tokens."""

    caches: Mapping[str, PrefixKVCache]
    tiers: TierConfig
    prefill_free_at: Mapping[str, float]
    prefill_tokens_per_s: float
    token_ids: list[int]


class Clairvoyant(Ours):
    """Today's placer, and each later turn moved where its true TTFT is lower by more than
    ``slack_s`` (analysis only: `TrueState` is what the replay shows it before each turn)."""

    def __init__(self, members: list[str], slack_s: float, **kwargs: float | None) -> None:
        super().__init__(members, ttft_slack_s=None, **kwargs)
        self.slack_s = slack_s
        self.state: TrueState | None = None
        self.homes: dict[str, str] = {}

    def __call__(self, key: str, loads: Mapping[str, int], now: float, tokens: int) -> str:
        chosen = super().__call__(key, loads, now, tokens)
        state = self.state
        if key in self.homes and state is not None:

            def true_ttft(replica: str) -> float:
                served = peek(state.caches[replica], state.tiers, state.token_ids)
                uncached = len(state.token_ids) - served.cached
                start = max(now, state.prefill_free_at[replica])
                return start + uncached / state.prefill_tokens_per_s + served.transfer_s

            fastest = min(state.caches, key=true_ttft)
            if true_ttft(fastest) + self.slack_s < true_ttft(chosen):
                chosen = fastest
                for placer in self.placers:
                    placer.table.assign(key, chosen)
        self.homes[key] = chosen
        return chosen


# Events: (time, kind, session index, turn index, replica). At equal times a replica is freed
# before a turn arrives; a first token reaches the reports after; a prefill step ends last.
_ENDS, _ARRIVES, _FIRST_TOKEN, _STEP_ENDS = 0, 1, 2, 3
Event = tuple[float, int, int, int, str]
Request = tuple[int, int]  # (session index, turn index); a warm-up's session index is negative


@dataclass
class _Prefilling:
    """A turn (or a warm-up) waiting for its prefill on a stepped engine."""

    arrived: float
    before: str | None  # the replica of the conversation's turn before (for the trace)
    hit: int
    decode_s: float


class Replay:
    """One trace through one policy, event by event (see the module's docstring)."""

    def __init__(
        self,
        sessions: list[Session],
        rendered: dict[str, list[Turn]],
        policy: Policy,
        members: list[str],
        engine: SimulatedEngineConfig,
        output_tokens: int,
        trace: list[dict[str, object]] | None = None,
        steps: EngineSteps | None = None,
        warm_second_home: bool = False,
        tiers: TierConfig | None = None,
    ) -> None:
        self.sessions, self.rendered, self.policy = sessions, rendered, policy
        self.members, self.engine, self.output_tokens = members, engine, output_tokens
        self.trace, self.steps = trace, steps
        self.warm_second_home = warm_second_home and steps is not None
        self.reporters: dict[str, ReplicaReporter] = getattr(policy, "reporters", {})
        self.tiers = tiers or TierConfig.scaled("none", engine.kv_cache_tokens, 1.0)
        shared = shared_tier(self.tiers, len(members), engine.block_size)
        self.caches = {
            member: tiered_cache(
                engine.block_size,
                engine.kv_cache_tokens,
                self.tiers,
                shared,
                on_events=self.reporters[member].held if member in self.reporters else None,
            )
            for member in members
        }
        self.transferred = 0  # tokens loaded or pulled from a tier
        self.stepped = {
            member: SteppedPrefill(
                steps.max_batched_tokens, steps.long_prefill_tokens, engine.prefill_tokens_per_s
            )
            for member in (members if steps is not None else [])
        }
        self.prefilling_now: dict[Request, _Prefilling] = {}
        self.ongoing: Counter[str] = Counter()
        self.prefill_free_at: Counter[str] = Counter()
        self.work: Counter[str] = Counter()
        self.computed: dict[str, int] = {}  # request id -> its uncached tokens, to its 1st token
        self.homes: dict[int, str] = {}  # session index -> its latest turn's replica
        self.second_homes: dict[int, str] = {}  # session index -> where its prompts are warmed
        self.events: list[Event] = [
            (session.start_s, _ARRIVES, index, 0, "") for index, session in enumerate(sessions)
        ]
        heapq.heapify(self.events)
        self.ttfts: list[float] = []
        self.prompt = self.cached = self.waited = 0
        self.prefilling = 0.0  # engine seconds of prefill, over every replica
        # Only ours waits, for a later turn of a conversation its router does not know.
        self.ready_at: Callable[[str, float], float] | None = getattr(policy, "ready_at", None)
        # Only ours, with --push-latency-s: each replica's load pushed as its ledger changes.
        self.pushes: LoadPushes | None = getattr(policy, "pushes", None)

    def run(self) -> Result:
        started = now = self.events[0][0]
        while self.events:
            now, kind, index, turn_index, replica = heapq.heappop(self.events)
            if self.pushes is not None:  # pushes due by now go out and arrive first
                self.pushes.advance(now)
            if kind == _STEP_ENDS:
                self._step_ends(replica, now)
            elif kind == _FIRST_TOKEN:
                # With the uncached tokens the engine computed, as the engine deployment passes
                # them (`num_prompt_tokens - num_cached_tokens`): the measured rate comes from
                # them.
                request_id = f"{index}/{turn_index}"
                self.reporters[replica].first_token(request_id, self.computed.pop(request_id), now)
                self._changed(replica, now)
            elif kind == _ENDS:
                self._ends((index, turn_index), replica, now)
            else:
                self._arrives((index, turn_index), replica == _WAITED, now)
        mean_work = statistics.mean(self.work[member] for member in self.members)
        return Result(
            self.cached / self.prompt,
            self.ttfts,
            max(self.work.values()) / mean_work,
            self.prefilling / len(self.members) / (now - started),
            self.waited / len(self.ttfts),
            self.transferred / self.prompt,
        )

    def _turn(self, request: Request) -> Turn:
        index, turn_index = request
        return self.rendered[self.sessions[index].session_id][turn_index]

    def _arrives(self, request: Request, waited: bool, now: float) -> None:
        index, turn_index = request
        turn = self._turn(request)
        if self.ready_at is not None and turn_index > 0 and not waited:
            ready = self.ready_at(turn.routing_key, now)
            if ready > now:
                self.waited += 1
                heapq.heappush(self.events, (ready, _ARRIVES, index, turn_index, _WAITED))
                return
        loads = {member: self.ongoing[member] for member in self.members}
        if isinstance(self.policy, Clairvoyant):
            self.policy.state = TrueState(
                self.caches,
                self.tiers,
                self.prefill_free_at,
                self.engine.prefill_tokens_per_s,
                turn.token_ids,
            )
        replica = self.policy(turn.routing_key, loads, now, len(turn.token_ids))
        before = self.homes.get(index)
        if before is not None and before != replica:
            self.second_homes[index] = before  # the home it left holds nearly all of it
        self.homes[index] = replica
        if replica in self.reporters:
            self.reporters[replica].arrived(
                f"{index}/{turn_index}", turn.routing_key, len(turn.token_ids)
            )
            self._changed(replica, now)
        # The cache is looked up on arrival: the same here for every policy (the engine looks
        # up when the prefill starts). The output is cached too, as the engine does; it never
        # matches a later prompt.
        served = self._store(replica, turn, [*turn.token_ids, *[0] * self.output_tokens])
        hit = served.cached
        uncached = len(turn.token_ids) - hit
        decode_s = (
            self.output_tokens
            * (1 + self.engine.batch_slowdown * self.ongoing[replica])
            / self.engine.decode_tokens_per_s
        )
        self.ongoing[replica] += 1
        self.work[replica] += self.output_tokens / self.engine.decode_tokens_per_s
        self.prompt += len(turn.token_ids)
        self.cached += hit
        prefilling = _Prefilling(now, before, hit, decode_s)
        if self.steps is None:
            # One prefill at a time, in arrival order; a load or pull from a tier holds the
            # turn's place in the queue, as in the simulated engine.
            starts = max(now, self.prefill_free_at[replica])
            prefill_s = uncached / self.engine.prefill_tokens_per_s + served.transfer_s
            self.prefill_free_at[replica] = starts + prefill_s
            self._first_token(request, replica, prefilling, self.prefill_free_at[replica])
            return
        queue = self.stepped[replica]
        queue.add(request, uncached, uncached if self.steps.by_uncached else 0)
        self.prefilling_now[request] = prefilling
        # What a clairvoyant placer would read as this replica's queue.
        queued_s = queue.queued_tokens() / self.engine.prefill_tokens_per_s
        self.prefill_free_at[replica] = now + queued_s
        self._start_step(replica, now)

    def _changed(self, replica: str, now: float) -> None:
        """The replica's prefill ledger changed: pushed to the routers (with pushes)."""
        if self.pushes is not None:
            self.pushes.changed(replica, now)

    def _store(self, replica: str, turn: Turn, tokens: list[int]) -> Served:
        """Looks ``turn`` up in the replica's cache (and the tiers behind it) and stores
        ``tokens``; how it was served, counting what the replica computes of it as prefill
        work (a tier's transfer is not)."""
        served = serve(self.caches[replica], self.tiers, turn.token_ids, tokens, turn.routing_key)
        self.transferred += served.loaded + served.pulled
        prefill_s = (len(turn.token_ids) - served.cached) / self.engine.prefill_tokens_per_s
        self.prefilling += prefill_s
        self.work[replica] += prefill_s
        return served

    def _start_step(self, replica: str, now: float) -> None:
        """The replica's next prefill step, unless one runs or nothing waits."""
        queue = self.stepped[replica]
        if queue.busy:
            return
        step_ends = queue.start_step(now)
        if step_ends is not None:
            heapq.heappush(self.events, (step_ends, _STEP_ENDS, -1, -1, replica))

    def _step_ends(self, replica: str, now: float) -> None:
        """A step of the replica's stepped prefill ends: the prefills it finished get their
        first token (a warm-up only reaches the reports), and the next step starts."""
        for request in self.stepped[replica].end_step():
            prefilling = self.prefilling_now.pop(request)
            if request[0] >= 0:
                self._first_token(request, replica, prefilling, now)
                continue
            warmed = (-1 - request[0], request[1])  # the turn whose prompt it warmed
            warm_id = "warm{}/{}".format(*warmed)
            uncached = len(self._turn(warmed).token_ids) - prefilling.hit
            self.reporters[replica].first_token(warm_id, uncached, now)
            self.reporters[replica].ended(warm_id)
            self._changed(replica, now)
        self._start_step(replica, now)

    def _first_token(
        self, request: Request, replica: str, prefilling: _Prefilling, at: float
    ) -> None:
        """A turn's prefill ended at ``at``: its TTFT, its first-token report, its end."""
        index, turn_index = request
        turn = self._turn(request)
        uncached = len(turn.token_ids) - prefilling.hit
        step_s = 1 / self.engine.decode_tokens_per_s
        self.ttfts.append((at - prefilling.arrived + step_s) * 1000)
        if self.trace is not None:
            starts = at - uncached / self.engine.prefill_tokens_per_s
            traced = _traced(
                turn, replica, prefilling.before, prefilling.hit, prefilling.arrived, starts
            )
            self.trace.append({**traced, "ttft_ms": self.ttfts[-1]})
        if replica in self.reporters:
            self.computed[f"{index}/{turn_index}"] = uncached
            heapq.heappush(self.events, (at + step_s, _FIRST_TOKEN, index, turn_index, replica))
        heapq.heappush(self.events, (at + prefilling.decode_s, _ENDS, index, turn_index, replica))

    def _ends(self, request: Request, replica: str, now: float) -> None:
        index, turn_index = request
        self.ongoing[replica] -= 1
        if replica in self.reporters:
            self.reporters[replica].ended(f"{index}/{turn_index}")
            self._changed(replica, now)
        if self.warm_second_home:
            self._warm_up(request, replica, now)
        session = self.sessions[index]
        if turn_index + 1 < len(session.turns):
            think = session.turns[turn_index + 1]["think_s"]
            heapq.heappush(self.events, (now + think, _ARRIVES, index, turn_index + 1, ""))

    def _warm_up(self, request: Request, home: str, now: float) -> None:
        """Analysis: the turn's prompt prefilled at the lowest priority on the conversation's
        second home (the home it left, or the least loaded other replica), so two replicas
        hold it."""
        index, turn_index = request
        second = self.second_homes.get(index)
        if second is None or second == home:
            others = [member for member in self.members if member != home]
            second = min(others, key=lambda member: (self.ongoing[member], member))
            self.second_homes[index] = second
        turn = self._turn(request)
        hit = self._store(second, turn, turn.token_ids).cached
        warm = (-1 - index, turn_index)
        self.reporters[second].arrived(
            f"warm{index}/{turn_index}", turn.routing_key, len(turn.token_ids)
        )
        self._changed(second, now)
        self.stepped[second].add(warm, len(turn.token_ids) - hit, float("inf"))
        self.prefilling_now[warm] = _Prefilling(now, None, hit, 0.0)
        self._start_step(second, now)


def _traced(
    turn: Turn, replica: str, before: str | None, hit: int, now: float, starts: float
) -> dict[str, object]:
    """One turn for ``--trace-out``; ``before``: where the conversation's turn before was."""
    kind = "first" if turn.index == 0 else "home" if before == replica else "moved"
    return {
        "session": turn.session_id,
        "turn": turn.index,
        "replica": replica,
        "kind": kind,
        "prompt_tokens": len(turn.token_ids),
        "cached_tokens": hit,
        "wait_ms": (starts - now) * 1000,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 1, 2, 3, 4])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rate", type=float, default=5.0, help="sessions started per second")
    parser.add_argument("--output-tokens", type=int, default=64, help="per turn")
    parser.add_argument("--prefill-tokens-per-s", type=float, default=20_000)
    parser.add_argument(
        "--kv-cache-tokens", type=int, default=262_144, help="each replica's prefix cache"
    )
    add_placer_options(parser)
    parser.add_argument(
        "--ingress-replicas", type=int, default=1, help="ours: routers, each with its own table"
    )
    parser.add_argument(
        "--clairvoyant-slack-s",
        type=float,
        nargs="*",
        default=[],
        help="analysis: today's placer with later turns moved by their true TTFT, each slack",
    )
    parser.add_argument("--trace-out", type=Path, help="every turn as a JSON line")
    parser.add_argument(
        "--max-batched-tokens",
        type=int,
        default=0,
        help="step the engine's prefill as vLLM's chunked prefill with this token budget a "
        "step (0: one prefill at a time, in arrival order)",
    )
    parser.add_argument(
        "--long-prefill-tokens",
        type=int,
        default=0,
        help="with --max-batched-tokens: vLLM's long_prefill_token_threshold (0: none)",
    )
    parser.add_argument(
        "--warm-second-home",
        action="store_true",
        help="analysis, ours with stepped prefill: each turn's prompt also prefilled at the "
        "lowest priority on a second replica once the turn ends",
    )
    parser.add_argument(
        "--by-uncached",
        action="store_true",
        help="with --max-batched-tokens: waiting prefills by fewest uncached tokens first "
        "(vLLM's priority policy), not by arrival",
    )
    parser.add_argument(
        "--kv-tier",
        choices=KV_TIERS,
        default="none",
        help="the tiers behind each replica's GPU prefix cache (loadtests/sim_tiers.py): none; "
        "cpu (vLLM's native offloading); shared (CPU tiers and a store the replicas share)",
    )
    parser.add_argument(
        "--cpu-tier-tokens",
        type=int,
        help="each replica's CPU tier (default: 5x --kv-cache-tokens, as a DGX H100 node)",
    )
    parser.add_argument(
        "--kv-load-tokens-per-s",
        type=float,
        help="CPU -> GPU load rate (default: 10x the prefill rate, docs/routing.md)",
    )
    parser.add_argument(
        "--shared-pull-tokens-per-s",
        type=float,
        help="shared tier -> GPU pull rate (default: 5.9x the prefill rate, llm-d's P2P pull)",
    )
    parser.add_argument(
        "--push-latency-s",
        type=float,
        help="ours: each replica's prefill load pushed to every router as it changes, reaching "
        "it this many seconds later (default: no pushes, the reports alone)",
    )
    parser.add_argument(
        "--push-window-s",
        type=float,
        default=0.02,
        help="with --push-latency-s: a change within this long of the replica's last push "
        "goes out at the window's end",
    )
    parser.add_argument(
        "--report-period",
        type=float,
        default=1.0,
        help="ours: seconds between the replicas' routing-stats reports",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    engine = SimulatedEngineConfig(
        prefill_tokens_per_s=args.prefill_tokens_per_s, kv_cache_tokens=args.kv_cache_tokens
    )
    tiers = TierConfig.scaled(
        args.kv_tier,
        args.kv_cache_tokens,
        args.prefill_tokens_per_s,
        args.cpu_tier_tokens,
        args.kv_load_tokens_per_s,
        args.shared_pull_tokens_per_s,
    )
    if tiers.kind != "none" and (args.max_batched_tokens or args.by_uncached):
        sys.exit("--kv-tier cpu/shared models transfers with one prefill at a time only")
    members = [f"replica-{index}" for index in range(args.replicas)]
    # What the placers are told of the tiers: the replicas report their load rate; the
    # shared tier's pull rate is a router option (`shared_kv_pull_tokens_per_s`).
    tier_options: dict[str, float | None] = {
        "kv_load_tokens_per_s": tiers.load_tokens_per_s if tiers.kind != "none" else None,
        "shared_kv_pull_tokens_per_s": (
            tiers.pull_tokens_per_s if tiers.kind == "shared" else None
        ),
    }
    push_options = {"push_latency_s": args.push_latency_s, "push_window_s": args.push_window_s}
    policies: dict[str, Callable[[], Policy]] = {
        "hash (Ray ConsistentHashRouter)": lambda: hash_owner(members),
        "pow2 (Ray default)": lambda: power_of_two(members),
    }
    for min_bound in args.min_bound:
        for slack in args.ttft_slack_s:
            name = "ours, today's placer" if slack < 0 else f"ours, by TTFT (slack {slack} s)"
            if len(args.min_bound) > 1:
                name += f", min_bound {min_bound}"
            policies[name] = lambda min_bound=min_bound, slack=slack: Ours(
                members,
                report_period_s=args.report_period,
                load_factor=args.load_factor,
                new_load_factor=args.new_load_factor or None,
                spill_factor=args.spill_factor,
                min_bound=min_bound,
                ttft_slack_s=None if slack < 0 else slack,
                ingress_replicas=args.ingress_replicas,
                **push_options,
                **tier_options,
            )
    for slack in args.clairvoyant_slack_s:
        policies[f"clairvoyant moves (slack {slack} s)"] = lambda slack=slack: Clairvoyant(
            members,
            slack,
            report_period_s=args.report_period,
            load_factor=args.load_factor,
            new_load_factor=args.new_load_factor or None,
            spill_factor=args.spill_factor,
            min_bound=args.min_bound[0],
            ingress_replicas=args.ingress_replicas,
            **push_options,
            **tier_options,
        )
    steps = (
        EngineSteps(args.max_batched_tokens, args.long_prefill_tokens, args.by_uncached)
        if args.max_batched_tokens or args.by_uncached
        else None
    )
    traces = args.trace_out.open("w") if args.trace_out else None
    columns = [
        "hit rate",
        "hit / oracle",
        "TTFT p50 (ms)",
        "TTFT p90 (ms)",
        "max/mean work",
        "prefill busy",
        "waited",
        "tier hits",
    ]
    totals: dict[str, list[list[float]]] = {name: [] for name in [*policies, "oracle"]}
    for seed in args.seeds:
        sessions = generate(args.sessions, args.rate, seed)
        rendered = {session.session_id: render_turns(session) for session in sessions}
        best_hit, best_ttfts = oracle(sessions, rendered, engine)
        best_ms = [ttft * 1000 for ttft in best_ttfts]
        totals["oracle"].append(
            [
                best_hit,
                1.0,
                statistics.median(best_ms),
                percentile(best_ms, 0.9),
                1.0,
                0.0,
                0.0,
                0.0,
            ]
        )
        for name, make in policies.items():
            trace: list[dict[str, object]] | None = [] if traces else None
            result = Replay(
                sessions,
                rendered,
                make(),
                members,
                engine,
                args.output_tokens,
                trace,
                steps,
                args.warm_second_home and name.startswith("ours"),
                tiers,
            ).run()
            if traces and trace is not None:
                traces.writelines(
                    json.dumps({"seed": seed, "policy": name, **turn}) + "\n" for turn in trace
                )
            totals[name].append(
                [
                    result.hit_rate,
                    result.hit_rate / best_hit,
                    statistics.median(result.ttfts_ms),
                    percentile(result.ttfts_ms, 0.9),
                    result.imbalance,
                    result.prefill_busy,
                    result.waited,
                    result.tier_hits,
                ]
            )
        print(f"seed {seed} done", file=sys.stderr, flush=True)
    if traces:
        traces.close()
    print(row("policy (mean over seeds)", columns))
    print(row("---", ["---:"] * len(columns)))
    formats = ["{:.3f}", "{:.3f}", "{:.0f}", "{:.0f}", "{:.2f}", "{:.0%}", "{:.1%}", "{:.1%}"]
    for name, runs in totals.items():
        means = [statistics.mean(values) for values in zip(*runs, strict=True)]
        worst = max(run[4] for run in runs)
        cells = [fmt.format(mean) for fmt, mean in zip(formats, means, strict=True)]
        cells[4] += f" (worst {worst:.2f})"
        if name == "oracle":
            cells[5] = cells[6] = cells[7] = "-"  # it has no replicas, routers nor tiers
        print(row(name, cells))
    print("\nTTFT p90 (ms) per seed:")
    for name, runs in totals.items():
        print(f"  {name}: {' '.join(f'{run[3]:.0f}' for run in runs)}")
    print("\nhit rate and max/mean work per seed:")
    for name, runs in totals.items():
        print(f"  {name}: {' '.join(f'{run[0]:.3f}/{run[4]:.2f}' for run in runs)}")
    print(
        f"\nseeds {args.seeds}: {args.sessions} sessions each at {args.rate}/s, "
        f"{args.replicas} replicas, {args.output_tokens} output tokens per turn; engine as "
        f"SimulatedEngineConfig's defaults but prefill at {args.prefill_tokens_per_s:.0f} "
        f"tokens/s; ours: load_factor {args.load_factor}, "
        f"new_load_factor {args.new_load_factor}, spill_factor {args.spill_factor}, "
        f"{args.ingress_replicas} ingress replica(s), reports every {args.report_period} s"
        + (
            f", loads pushed {args.push_latency_s} s late, {args.push_window_s} s apart"
            if args.push_latency_s is not None
            else ""
        )
        + "; "
        f"KV tier {tiers.kind}"
        + (
            f" (CPU tier {tiers.cpu_tokens} tokens a replica, loads at "
            f"{tiers.load_tokens_per_s:.0f} tokens/s"
            + (f", shared pulls at {tiers.pull_tokens_per_s:.0f}" if tiers.kind == "shared" else "")
            + ")"
            if tiers.kind != "none"
            else ""
        )
    )


if __name__ == "__main__":
    main()
