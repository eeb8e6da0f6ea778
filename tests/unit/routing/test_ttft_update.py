"""However little `TTFTPredictor.update` derives again on a delivery, after any sequence of
deliveries, pushes, turns sent and time passing every prediction is the one of the predictor
that derived every replica's state from every report on each delivery (`FullRebuild`, that
predictor as it was, kept here as the reference), to the last bit.

A replica's report is known by its ``reported_at``, as `DirectoryMerger` knows it: here, as
from a replica, the same ``reported_at`` is always the same report (delivered again as the very
object or as a copy, as Serve unpickles it)."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.routing.directory import REPORTED_AT_KEY
from serve_app.routing.prefill import QUEUED_AHEAD_KEY, QUEUED_KEY, RATE_KEY, SHARED_KEY
from serve_app.routing.replica_report import (
    CPU_HELD_KEY,
    HELD_KEY,
    KV_EVENTS_KEY,
    KV_LOAD_RATE_KEY,
)
from serve_app.routing.ring import stable_hash
from serve_app.routing.ttft import (
    DEFAULT_KV_LOAD_TOKENS_PER_S,
    DEFAULT_PREFILL_TOKENS_PER_S,
    MAX_UNREPORTED_S,
    TTFTPredictor,
)

# The predictor as it was before its update became incremental (serve_app/routing/ttft.py at
# 64344b2, docstrings left out): every delivery clears every replica's state and derives it
# again from every report, every kept push and every turn sent.


@dataclass
class _Backlog:
    tokens: float
    at: float


@dataclass(frozen=True)
class _Sent:
    replica: str
    conversation: int
    prompt_tokens: int
    uncached_tokens: float
    at: float
    request_id: str | None = None
    priority: int | None = None


def _ahead_backlogs(stats: Mapping[str, Any], at: float) -> dict[int, _Backlog]:
    ahead = stats.get(QUEUED_AHEAD_KEY) or {}
    return {int(rank): _Backlog(float(tokens), at) for rank, tokens in ahead.items()}


@dataclass
class FullRebuild:
    default_rate: float = DEFAULT_PREFILL_TOKENS_PER_S
    clock: Callable[[], float] = time.time
    # The KV tier all replicas share, pulled at this many tokens/s (None: no shared tier).
    shared_pull_tokens_per_s: float | None = None
    _backlogs: dict[str, _Backlog] = field(default_factory=dict)
    # Each replica's queue ahead of each rank it reports (issue 49), as the backlog is.
    _ahead: dict[str, dict[int, _Backlog]] = field(default_factory=dict)
    _rates: dict[str, float] = field(default_factory=dict)
    _held: dict[str, Mapping[int, int]] = field(default_factory=dict)
    _cpu_held: dict[str, Mapping[int, int]] = field(default_factory=dict)
    _load_rates: dict[str, float] = field(default_factory=dict)
    _shared: dict[str, int] = field(default_factory=dict)
    # Each replica's BlockRemoved count at its latest report, and whether it grew since the
    # report before (the replica evicts: its cache is full).
    _removed: dict[str, tuple[float, int]] = field(default_factory=dict)
    _evicting: set[str] = field(default_factory=set)
    _reported_at: dict[str, float] = field(default_factory=dict)
    _sent: list[_Sent] = field(default_factory=list)  # since the replica's latest report
    _reports: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # the latest each
    # The latest load each replica pushed (`pushed`), kept while newer than its report.
    _pushes: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    def update(self, reports: Mapping[str, Mapping[str, Any]]) -> None:
        latest = {
            replica: self._reports[replica] for replica in reports if replica in self._reports
        }
        for replica, stats in reports.items():
            reported_at = stats.get(REPORTED_AT_KEY)
            if reported_at is None or QUEUED_KEY not in stats:
                continue
            if reported_at >= latest.get(replica, {}).get(REPORTED_AT_KEY, float("-inf")):
                latest[replica] = stats
        self._reports = latest
        self._backlogs.clear()
        self._ahead.clear()
        self._rates.clear()
        self._held.clear()
        self._cpu_held.clear()
        self._load_rates.clear()
        self._shared.clear()
        self._reported_at.clear()
        for replica, stats in latest.items():
            reported_at = stats[REPORTED_AT_KEY]
            self._reported_at[replica] = reported_at
            self._backlogs[replica] = _Backlog(float(stats[QUEUED_KEY]), reported_at)
            self._ahead[replica] = _ahead_backlogs(stats, reported_at)
            if stats.get(RATE_KEY):
                self._rates[replica] = float(stats[RATE_KEY])
            self._held[replica] = stats.get(HELD_KEY) or {}
            self._cpu_held[replica] = stats.get(CPU_HELD_KEY) or {}
            if stats.get(KV_LOAD_RATE_KEY):
                self._load_rates[replica] = float(stats[KV_LOAD_RATE_KEY])
            if stats.get(SHARED_KEY) is not None:
                self._shared[replica] = int(stats[SHARED_KEY])
            self._note_evictions(replica, reported_at, stats)
        self._evicting &= latest.keys()
        self._removed = {r: seen for r, seen in self._removed.items() if r in latest}
        # Kept until the replica reports after it; bounded for a replica that never reports.
        oldest = self.clock() - MAX_UNREPORTED_S
        self._sent = [
            sent
            for sent in self._sent
            if sent.at > max(self._reported_at.get(sent.replica, oldest), oldest)
        ]
        self._pushes = {
            replica: load
            for replica, load in self._pushes.items()
            if load[REPORTED_AT_KEY] > self._reported_at.get(replica, float("inf"))
        }
        for replica, load in self._pushes.items():
            self._apply_push(replica, load)
        pushed = self._pushes.keys()
        for sent in self._sent:  # in the order sent: the backlog drains between them
            if sent.replica not in pushed:
                self._add(sent)

    def pushed(self, replica: str, load: Mapping[str, Any]) -> bool:
        at = load.get(REPORTED_AT_KEY)
        if at is None or QUEUED_KEY not in load or replica not in self._reported_at:
            return False
        latest = self._pushes.get(replica, {}).get(REPORTED_AT_KEY, self._reported_at[replica])
        if at <= latest:
            return False
        self._pushes[replica] = load
        self._apply_push(replica, load)
        return True

    def _apply_push(self, replica: str, load: Mapping[str, Any]) -> None:
        at = load[REPORTED_AT_KEY]
        if load.get(RATE_KEY):
            self._rates[replica] = float(load[RATE_KEY])
        self._backlogs[replica] = _Backlog(float(load[QUEUED_KEY]), at)
        self._ahead[replica] = _ahead_backlogs(load, at)
        for sent in self._sent:
            if sent.replica == replica and sent.at > at:
                self._add(sent)

    def _note_evictions(self, replica: str, reported_at: float, stats: Mapping[str, Any]) -> None:
        removed = int((stats.get(KV_EVENTS_KEY) or {}).get("BlockRemoved", 0))
        before = self._removed.get(replica)
        if before is not None and reported_at <= before[0]:
            return  # the same report again
        self._removed[replica] = (reported_at, removed)
        if before is not None and removed > before[1]:
            self._evicting.add(replica)
        elif before is not None:
            self._evicting.discard(replica)

    def evicting(self, replica: str) -> bool:
        return replica in self._evicting

    def predict(
        self, replica: str, key: str, prompt_tokens: int, priority: int | None = None
    ) -> float:
        now = self.clock()
        queued = self._queued(replica, now, priority)
        return (queued + self.uncached(replica, key, prompt_tokens)) / self.rate(replica)

    def uncached(self, replica: str, key: str, prompt_tokens: int) -> float:
        conversation = stable_hash(key)
        gpu = max(self._held.get(replica, {}).get(conversation, 0), self.shared(replica))
        gpu = max(gpu, self._sent_prompt(replica, conversation))
        last = prompt_tokens - 1  # the most a turn finds held
        gpu = min(gpu, last)
        local = min(last, gpu + self._cpu_held.get(replica, {}).get(conversation, 0))
        shared = min(last, self._shared_tier_held(conversation))
        rate = self.rate(replica)
        cost: float = prompt_tokens - max(local, shared, gpu)
        if local > gpu:  # loaded from its CPU tier, or pulled if that is quicker
            fastest = max(self.load_rate(replica), self._pull_rate(shared, local))
            cost += (local - gpu) * rate / fastest
        if shared > max(local, gpu):
            cost += (shared - max(local, gpu)) * rate / self._pull_rate(shared, shared)
        return cost

    def _sent_prompt(self, replica: str, conversation: int) -> int:
        reported_at = self._reported_at.get(replica, float("-inf"))
        sent_prompt = 0
        for sent in self._sent:  # few: the turns this router sent within one report period
            if (sent.replica, sent.conversation) == (replica, conversation) and (
                sent.at > reported_at
            ):
                sent_prompt = max(sent_prompt, sent.prompt_tokens)
        return sent_prompt

    def _shared_tier_held(self, conversation: int) -> int:
        if self.shared_pull_tokens_per_s is None:
            return 0
        held = [
            held.get(conversation, 0) + self._cpu_held.get(replica, {}).get(conversation, 0)
            for replica, held in self._held.items()
        ]
        held.extend(sent.prompt_tokens for sent in self._sent if sent.conversation == conversation)
        return max(held, default=0)

    def _pull_rate(self, shared: int, upto: int) -> float:
        if self.shared_pull_tokens_per_s is None or shared < upto:
            return 0.0
        return self.shared_pull_tokens_per_s

    def load_rate(self, replica: str) -> float:
        return self._load_rates.get(replica, DEFAULT_KV_LOAD_TOKENS_PER_S)

    def shared(self, replica: str) -> int:
        shared = self._shared.get(replica)
        if shared is not None:
            return shared
        if self._shared:
            return round(sum(self._shared.values()) / len(self._shared))
        return 0

    def rate(self, replica: str) -> float:
        rate = self._rates.get(replica)
        if rate is not None:
            return rate
        if self._rates:
            return sum(self._rates.values()) / len(self._rates)
        return self.default_rate

    def sent(
        self,
        replica: str,
        key: str,
        prompt_tokens: int,
        request_id: str | None = None,
        priority: int | None = None,
    ) -> None:
        now = self.clock()
        if request_id is not None:
            for earlier in [sent for sent in self._sent if sent.request_id == request_id]:
                self._sent.remove(earlier)
                for backlog in self._backlogs_holding(earlier, now):
                    backlog.tokens = max(0.0, backlog.tokens - earlier.uncached_tokens)
        uncached = self.uncached(replica, key, prompt_tokens)
        conversation = stable_hash(key)
        sent = _Sent(replica, conversation, prompt_tokens, uncached, now, request_id, priority)
        self._add(sent)
        self._sent.append(sent)

    def _add(self, sent: _Sent) -> None:
        for backlog in self._backlogs_holding(sent, sent.at):
            backlog.tokens += sent.uncached_tokens

    def _backlogs_holding(self, sent: _Sent, now: float) -> list[_Backlog]:
        ahead = self._ahead.get(sent.replica, {})
        ranks = [rank for rank in ahead if sent.priority is None or rank >= sent.priority]
        return [
            self._backlog(sent.replica, now),
            *(self._drained(sent.replica, ahead[rank], now) for rank in ranks),
        ]

    def _queued(self, replica: str, now: float, priority: int | None = None) -> float:
        ahead = self._ahead.get(replica, {}).get(priority) if priority is not None else None
        if ahead is not None:
            return self._drained(replica, ahead, now).tokens
        return self._backlog(replica, now).tokens

    def _backlog(self, replica: str, now: float) -> _Backlog:
        backlog = self._backlogs.get(replica)
        if backlog is None:
            backlog = self._backlogs[replica] = _Backlog(0.0, now)
        return self._drained(replica, backlog, now)

    def _drained(self, replica: str, backlog: _Backlog, now: float) -> _Backlog:
        if now > backlog.at:
            backlog.tokens = max(0.0, backlog.tokens - self.rate(replica) * (now - backlog.at))
            backlog.at = now
        return backlog


# --- the property: deriving only what changed gives every prediction of deriving everything ---

REPLICAS = ("r0", "r1", "r2", "r3")
UNKNOWN = "r9"  # never reports: turns are sent there and it is predicted all the same
KEYS = ("a", "b", "c")
CONVERSATIONS = [stable_hash(key) for key in KEYS]
RANKS = (0, 1, 2)
REQUESTS = (None, "q0", "q1", "q2")  # the same id again: Ray routed the request again

Step = tuple[Any, ...]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# Slow rates too: a queue that outlasts MAX_UNREPORTED_S. 0: not measured yet.
rates = st.one_of(st.just(0.0), st.floats(100, 50_000))
queues_ahead = st.dictionaries(st.sampled_from(RANKS), st.floats(0, 20_000), max_size=3)
held = st.dictionaries(st.sampled_from(CONVERSATIONS), st.integers(0, 9_000), max_size=3)
# What a replica's report says, but when it was made.
report_contents = st.fixed_dictionaries(
    {QUEUED_KEY: st.floats(0, 20_000)},
    optional={
        QUEUED_AHEAD_KEY: queues_ahead,
        RATE_KEY: rates,
        HELD_KEY: held,
        CPU_HELD_KEY: held,
        KV_LOAD_RATE_KEY: st.floats(10_000, 1_000_000),
        SHARED_KEY: st.integers(0, 5_000),
        KV_EVENTS_KEY: st.builds(lambda n: {"BlockRemoved": n}, st.integers(0, 4)),
    },
)
# A replica's pushed load (`ReplicaReporter.load`), but when it was made.
loads = st.fixed_dictionaries(
    {QUEUED_KEY: st.floats(0, 20_000)}, optional={QUEUED_AHEAD_KEY: queues_ahead, RATE_KEY: rates}
)


@st.composite
def delivery(draw: st.DrawFn, now: float, made: dict[str, list[dict[str, Any]]]) -> Step:
    """Every listed replica's stats, in an order of Serve's: a new report (made a little before
    now, or after by a replica whose clock is ahead), the latest again (the object, or a copy),
    an older one (a late delivery), none yet, one without a queue, or not listed (gone)."""
    reports: dict[str, Mapping[str, Any]] = {}
    for replica in draw(st.permutations(REPLICAS)):
        action = draw(st.sampled_from(["new", "same", "copy", "older", "none", "no queue", "gone"]))
        earlier = made.setdefault(replica, [])
        if action == "new" or (action in ("same", "copy", "older") and not earlier):
            at = now + draw(st.floats(-3, 0.5))
            known = [report for report in earlier if report[REPORTED_AT_KEY] == at]
            report = known[0] if known else {**draw(report_contents), REPORTED_AT_KEY: at}
            earlier.append(report)
            reports[replica] = report
        elif action == "same":
            reports[replica] = earlier[-1]
        elif action == "copy":
            reports[replica] = dict(earlier[-1])
        elif action == "older":
            reports[replica] = draw(st.sampled_from(earlier))
        elif action == "none":
            reports[replica] = {}
        elif action == "no queue":
            reports[replica] = {REPORTED_AT_KEY: now}
    return ("update", reports)


@st.composite
def steps(draw: st.DrawFn) -> list[Step]:
    now = Clock().now
    made: dict[str, list[dict[str, Any]]] = {}
    drawn: list[Step] = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["update", "update", "push", "send", "send", "wait", "look"]))
        replica = draw(st.sampled_from([*REPLICAS, UNKNOWN]))
        if kind == "update":
            drawn.append(draw(delivery(now, made)))
        elif kind == "push":  # as `ReplicaReporter.load`: older than the report, or newer
            load = {**draw(loads), REPORTED_AT_KEY: now + draw(st.floats(-3, 0.5))}
            drawn.append(("push", replica, load))
        elif kind == "send":
            turn = (draw(st.sampled_from(KEYS)), draw(st.integers(1, 12_000)))
            rank = draw(st.sampled_from([None, *RANKS]))
            drawn.append(("send", replica, *turn, draw(st.sampled_from(REQUESTS)), rank))
        elif kind == "wait":  # moments, seconds, past MAX_UNREPORTED_S, back (a wall clock)
            waited = draw(
                st.sampled_from(
                    [st.floats(0, 0.05), st.floats(0, 2), st.floats(20, 40), st.floats(-1, 0)]
                )
            )
            seconds = draw(waited)
            now += seconds
            drawn.append(("wait", seconds))
        else:  # predictions drain the queues they read: of some replicas only, some steps
            looked = draw(st.lists(st.sampled_from([*REPLICAS, UNKNOWN]), unique=True))
            drawn.append(("look", looked, draw(st.sampled_from(KEYS)), draw(st.integers(1, 9_000))))
    return drawn


Predictor = TTFTPredictor | FullRebuild


def _take(step: Step, predictor: Predictor) -> Any:
    kind, *args = step
    if kind == "update":
        return predictor.update(*args)
    if kind == "push":
        return predictor.pushed(*args)
    if kind == "send":
        return predictor.sent(*args)
    if kind == "wait":
        return None  # the clock is shared: moved once, by the test
    replicas, key, prompt_tokens = args
    return [
        predictor.predict(replica, key, prompt_tokens, rank)
        for replica in replicas
        for rank in (None, *RANKS)
    ]


def _seen(predictor: Predictor) -> list[Any]:
    """What a placement reads of every replica, the predictions of a copy: a prediction drains
    the queues it reads, and these are not to (the "look" steps do)."""
    probe = _copy(predictor)
    return [
        (
            replica,
            predictor.rate(replica),
            predictor.load_rate(replica),
            predictor.shared(replica),
            predictor.evicting(replica),
            [predictor.uncached(replica, key, 4_000) for key in KEYS],
            [probe.predict(replica, "a", 4_000, rank) for rank in (None, *RANKS)],
        )
        for replica in (*REPLICAS, UNKNOWN)
    ]


def _copy(predictor: Predictor) -> Predictor:
    return pickle.loads(pickle.dumps(predictor))  # what copy.deepcopy does, a few times faster


@settings(deadline=None)  # a loaded shared machine: time is not what is tested
@given(steps(), st.sampled_from([None, 40_000.0]))
def test_deriving_only_what_changed_predicts_as_deriving_everything(
    drawn: list[Step], shared_pull_tokens_per_s: float | None
) -> None:
    clock = Clock()
    incremental = TTFTPredictor(clock=clock, shared_pull_tokens_per_s=shared_pull_tokens_per_s)
    reference = FullRebuild(clock=clock, shared_pull_tokens_per_s=shared_pull_tokens_per_s)
    for step in drawn:
        if step[0] == "wait":
            clock.now += step[1]
        assert _take(step, incremental) == _take(step, reference), step
        assert _seen(incremental) == _seen(reference), step
        assert incremental._pushes == reference._pushes


def _stats(reported_at: float, queued: float, rate: float) -> dict[str, Any]:
    return {REPORTED_AT_KEY: reported_at, QUEUED_KEY: queued, RATE_KEY: rate}


def test_a_report_is_known_by_when_it_was_made() -> None:
    """The same ``reported_at`` again is the report already read, whatever it says (as
    `DirectoryMerger` reads them: Serve hands every replica's stats on every delivery); a later
    one is read, even in the very mapping of the earlier."""
    clock = Clock()
    predictor = TTFTPredictor(clock=clock)
    report = _stats(clock.now, queued=4_000, rate=4_000)
    predictor.update({"r0": report})
    predictor.update({"r0": {**report, QUEUED_KEY: 8_000}})
    assert predictor.predict("r0", "a", 1) == (4_000 + 1) / 4_000
    report.update(_stats(clock.now + 0.5, queued=2_000, rate=2_000))
    predictor.update({"r0": report})
    assert predictor.predict("r0", "a", 1) == (2_000 + 1) / 2_000
