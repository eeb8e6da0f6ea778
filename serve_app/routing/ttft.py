"""Predicted time to first token of a turn on each engine replica, from the replicas' reports.

A turn's first token waits for the uncached prompt tokens queued ahead of it on its replica,
then for its own uncached prefill; prefills share the accelerator, so both go at the replica's
prefill rate:

    TTFT(replica) = (queued_prefill_tokens(replica) + uncached(turn, replica)) / rate(replica)

- ``queued_prefill_tokens``: the replica's report (``serve_app.routing.prefill``), or the load
  it pushed since (`pushed`: its ledger as of the push, sent over the engine channel to every
  ingress replica as its queue changes, so a router sees the turns the other routers sent a
  few milliseconds ago, not a report period ago), drained at its rate for the time since,
  plus the uncached tokens of the turns this router sent there since (neither has them yet);
- ``uncached``: the turn's prompt tokens minus what the replica holds of its conversation, by
  its KV-cache summary (``serve_app.routing.kv_summary``), or, if this router sent the
  conversation there after the replica's last report, the prompt it sent (the replica holds it
  now); and never less than the replica's shared prefix, what a conversation it holds none of
  finds cached (``serve_app.routing.prefill``): moving a conversation costs its own history,
  not the system prompt every replica holds. At least one token: the last prompt token is
  always computed;
- tiers: a prefix the replica holds only in its CPU tier (its report's ``cpu_held_tokens``)
  is loaded, not computed: it counts ``rate / kv_load_tokens_per_s`` prefill tokens a token
  (the replica's reported load rate, else ``DEFAULT_KV_LOAD_TOKENS_PER_S``). With a tier all
  replicas share (``shared_pull_tokens_per_s`` set, the placer's
  ``shared_kv_pull_tokens_per_s``), what any replica holds of the conversation is in it, and
  a replica holding less pulls the rest at that rate. Each token at its cheapest tier (the
  GPU free, then the CPU tier or the shared one, whichever is quicker), the rest computed. The
  engine loads and pulls in the request's turn of its prefill queue, so the queue ahead counts
  them the same way (``sent``, and the replica's own ``queued_prefill_tokens``). A warm turn
  queued at its home then moves to an idle replica when its prefix can follow it cheaply (the
  shared tier) and stays when it cannot. With no tier configured or reported, nothing changes;
- ``rate``: the replica's measured prefill rate; one that has not measured it yet (just
  started) is taken at the mean of the others', and with none measured at
  ``prefill_tokens_per_s`` (then only the token counts matter);
- tiers (issue 49): engines serve the earliest deadline first, so a turn of a rank the replica
  reports (``queued_prefill_tokens_ahead``: ``serve_app.routing.prefill``) waits for that
  queue, not the whole: a priority turn's home with a flex flood queued is still fast for it,
  and it stays there. The turns this router sent since count ahead of the ranks at or after
  their own. A turn of a rank the replica reports nothing for waits for the whole queue.

`affinity.choose_fastest` sends the turn to the lowest prediction among the replicas the load
bounds allow, preferring, among those within ``slack_s`` of the lowest, the first in affinity
order (the conversation's home, then the ring from its key; a new conversation's, the replica
running fewest conversations first). Pure Python, no Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_app.routing.directory import REPORTED_AT_KEY
from serve_app.routing.prefill import QUEUED_AHEAD_KEY, QUEUED_KEY, RATE_KEY, SHARED_KEY
from serve_app.routing.replica_report import (
    CPU_HELD_KEY,
    HELD_KEY,
    KV_EVENTS_KEY,
    KV_LOAD_RATE_KEY,
)
from serve_app.routing.ring import stable_hash

# Until a replica has measured its rate (only the ratio of tokens matters while none has).
DEFAULT_PREFILL_TOKENS_PER_S = 20_000.0
# Predictions this close to the lowest count as a tie, which affinity breaks (docs/routing.md).
DEFAULT_TTFT_SLACK_S = 0.05
# A turn sent to a replica that has not reported since is remembered at most this long.
MAX_UNREPORTED_S = 30.0
# CPU -> GPU load rate of a replica that reports CPU-held tokens but no rate (tokens/s):
# gpt-oss-120b's 72 KiB per token at about 40 GB/s of PCIe 5 host-to-device copy.
DEFAULT_KV_LOAD_TOKENS_PER_S = 500_000.0


@dataclass
class _Backlog:
    """A replica's queued uncached prefill tokens as of ``at``, drained in place by each
    prediction; and as of ``settled_at`` as `TTFTPredictor.update` derives them (from the report
    or pushed load, then each turn sent since, drained only to that turn's time). A delivery
    starts again from the settled figures (``delivery``: the one ``tokens`` is of), as it did
    when every delivery derived every backlog again (and so to the same bit: a drain in two
    steps can differ from one in the last bit)."""

    tokens: float
    at: float
    delivery: int = 0
    settled_tokens: float = field(init=False)
    settled_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.settled_tokens, self.settled_at = self.tokens, self.at


@dataclass(frozen=True)
class _Sent:
    replica: str
    conversation: int
    prompt_tokens: int
    uncached_tokens: float
    at: float
    request_id: str | None = None
    priority: int | None = None  # its rank (None: not known, ahead of every rank)


@dataclass
class TTFTPredictor:
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
    # Each replica's turns this router sent since its latest report, in the order sent (its
    # backlog drains between them).
    _sent: dict[str, list[_Sent]] = field(default_factory=dict)
    _reports: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # the latest each
    # The latest load each replica pushed (`pushed`), kept while newer than its report.
    _pushes: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    # The replicas whose backlog changed since the last `update` otherwise than by a turn sent
    # (a push, a turn sent again elsewhere or no later than the replica's push, a prediction of
    # a replica with none): the next derives it again.
    _unsettled: set[str] = field(default_factory=set)
    _deliveries: int = 0  # `update`s so far (`_Backlog.delivery`)

    def update(self, reports: Mapping[str, Mapping[str, Any]]) -> None:
        """The replicas' latest routing-stats reports. A replica listed without one (Serve
        lists a replica before its first report, and may pass a replica's stats on late)
        keeps the latest this predictor had: forgetting what its home holds would send a
        conversation away from its prefix. A replica no longer listed is forgotten.

        Serve delivers every replica's stats whenever one changed (up to ten times a second),
        so only what changed is derived again (as `DirectoryMerger` merges): a report is known
        by its ``reported_at`` (the same again is the same report), and a replica's state is
        derived again when it reported anew or went, a push was taken or a turn sent there
        expired or was sent again elsewhere, or its rate is the others' mean (which any report
        may move). The others keep theirs, what deriving it again would give: each backlog
        keeps its settled figures as a turn is sent, and a prediction drains a copy
        (`_Backlog`). A delivery so costs a look at each listed replica's ``reported_at`` and
        rate, and the work of the replicas that changed."""
        self._deliveries += 1  # every backlog starts again from its settled figures
        previous = self._reports
        self._reports = latest = {}
        new = _latest_reports(previous, self._reported_at, reports, latest)
        gone = [replica for replica in previous if replica not in latest]
        for replica in new:
            self._take_report(replica, latest[replica])
        for replica in gone:
            self._forget(replica)
        stale = self._unsettled | set(new) | set(gone) | self._expire_sent()
        self._pushes = {
            replica: load
            for replica, load in self._pushes.items()
            if load[REPORTED_AT_KEY] > self._reported_at.get(replica, float("inf"))
        }
        # In the order of ``latest``: the others' mean sums them in it (the same to the bit).
        self._rates = {
            r: float(stats[RATE_KEY]) for r, stats in latest.items() if stats.get(RATE_KEY)
        }
        # A turn sent to a replica without a rate of its own drained at the others' mean.
        stale.update(replica for replica in self._sent if not self._rated(replica))
        self._settle(stale)
        self._unsettled = set()

    def _take_report(self, replica: str, stats: Mapping[str, Any]) -> None:
        """What a replica's new report says, but its queue (`_settle`)."""
        reported_at = stats[REPORTED_AT_KEY]
        self._reported_at[replica] = reported_at
        self._held[replica] = stats.get(HELD_KEY) or {}
        self._cpu_held[replica] = stats.get(CPU_HELD_KEY) or {}
        if stats.get(KV_LOAD_RATE_KEY):
            self._load_rates[replica] = float(stats[KV_LOAD_RATE_KEY])
        else:
            self._load_rates.pop(replica, None)
        if stats.get(SHARED_KEY) is not None:
            self._shared[replica] = int(stats[SHARED_KEY])
        else:
            self._shared.pop(replica, None)
        self._note_evictions(replica, reported_at, stats)

    def _forget(self, replica: str) -> None:
        """A replica no longer listed: what its report said (the turns sent there stay until
        they expire, should it be listed again)."""
        for reported in (self._reported_at, self._held, self._cpu_held, self._load_rates):
            reported.pop(replica, None)
        self._shared.pop(replica, None)
        self._removed.pop(replica, None)
        self._evicting.discard(replica)

    def _expire_sent(self) -> set[str]:
        """Forgets the turns sent before their replica's latest report (it counts them) or
        longer ago than MAX_UNREPORTED_S (one that never reports); the replicas that had some."""
        oldest = self.clock() - MAX_UNREPORTED_S
        expired = set()
        for replica, sents in list(self._sent.items()):
            after = max(self._reported_at.get(replica, oldest), oldest)
            kept = [sent for sent in sents if sent.at > after]
            if len(kept) < len(sents):
                expired.add(replica)
            if kept:
                self._sent[replica] = kept
            else:
                del self._sent[replica]
        return expired

    def _rated(self, replica: str) -> bool:
        """Whether the replica's rate is its own (reported or pushed), not the others' mean."""
        stats = self._reports.get(replica, {})
        return bool(stats.get(RATE_KEY) or self._pushes.get(replica, {}).get(RATE_KEY))

    def _settle(self, stale: set[str]) -> None:
        """Derives the queues of the ``stale`` replicas again: each from its report, or its
        pushed load, then the turns sent there since, in the order sent. Every pushed rate is
        taken in the pushes' order, as they came: a replica without a rate of its own drains
        at the mean of those taken before it."""
        for replica in stale:
            self._backlogs.pop(replica, None)
            self._ahead.pop(replica, None)
            stats = self._reports.get(replica)
            if stats is not None:
                reported_at = stats[REPORTED_AT_KEY]
                self._backlogs[replica] = self._new_backlog(float(stats[QUEUED_KEY]), reported_at)
                self._ahead[replica] = self._ahead_backlogs(stats, reported_at)
        for replica, load in self._pushes.items():
            if load.get(RATE_KEY):
                self._rates[replica] = float(load[RATE_KEY])
            if replica in stale:
                self._apply_push(replica, load)
        for replica in stale:
            if replica not in self._pushes:
                for sent in self._sent.get(replica, ()):  # the backlog drains between them
                    self._add(sent)

    def pushed(self, replica: str, load: Mapping[str, Any]) -> bool:
        """The load ``replica`` pushed (`ReplicaReporter.load`: its queued prefill and rate as
        of ``reported_at``), newer than its report: what its queue holds now, the other
        routers' turns included. Replaces the backlog from the report; this router's turns
        sent after it still count. A load older than the replica's report or its latest push
        (pushes and reports take different paths) is ignored, as is one of a replica this
        predictor has no report of (a replica Serve has not listed yet, or no longer lists).
        Whether it was taken."""
        at = load.get(REPORTED_AT_KEY)
        if at is None or QUEUED_KEY not in load or replica not in self._reported_at:
            return False
        latest = self._pushes.get(replica, {}).get(REPORTED_AT_KEY, self._reported_at[replica])
        if at <= latest:
            return False
        self._pushes[replica] = load
        self._apply_push(replica, load)
        # Its rate may be an earlier push's, where the next delivery takes this one's or the
        # report's: derived again then.
        self._unsettled.add(replica)
        return True

    def _apply_push(self, replica: str, load: Mapping[str, Any]) -> None:
        """The replica's backlog from its pushed load, plus this router's turns sent after."""
        at = load[REPORTED_AT_KEY]
        if load.get(RATE_KEY):
            self._rates[replica] = float(load[RATE_KEY])
        self._backlogs[replica] = self._new_backlog(float(load[QUEUED_KEY]), at)
        self._ahead[replica] = self._ahead_backlogs(load, at)
        for sent in self._sent.get(replica, ()):
            if sent.at > at:
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
        """Seconds to the first token of a turn of ``key`` with ``prompt_tokens`` on ``replica``;
        ``priority``: its rank (the queue ahead of it; None: the whole queue)."""
        now = self.clock()
        queued = self._queued(replica, now, priority)
        return (queued + self.uncached(replica, key, prompt_tokens)) / self.rate(replica)

    def uncached(self, replica: str, key: str, prompt_tokens: int) -> float:
        """What the turn's prompt costs ``replica`` before its first token, in prefill tokens
        of the same time: its prefix priced at the cheapest tier holding it (the replica's
        GPU free, its CPU tier at the load rate, the shared tier at the pull rate), the rest
        computed. At least one token (the last prompt token is always computed)."""
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
        """The longest prompt of the conversation this router sent ``replica`` since its
        latest report (the replica holds it now; 0: none)."""
        reported_at = self._reported_at.get(replica, float("-inf"))
        sent_prompt = 0
        for sent in self._sent.get(replica, ()):  # few: those sent within a report period
            if sent.conversation == conversation and sent.at > reported_at:
                sent_prompt = max(sent_prompt, sent.prompt_tokens)
        return sent_prompt

    def _shared_tier_held(self, conversation: int) -> int:
        """What the shared tier holds of the conversation: every replica writes the blocks it
        computes there, so at least the most any replica holds of it (or was sent since its
        report). 0 without a shared tier. Blocks the tier has that no replica still reports
        are not counted (the safe side: a prefill predicted that is a pull)."""
        if self.shared_pull_tokens_per_s is None:
            return 0
        held = [
            held.get(conversation, 0) + self._cpu_held.get(replica, {}).get(conversation, 0)
            for replica, held in self._held.items()
        ]
        held.extend(
            sent.prompt_tokens
            for sents in self._sent.values()
            for sent in sents
            if sent.conversation == conversation
        )
        return max(held, default=0)

    def _pull_rate(self, shared: int, upto: int) -> float:
        """The shared tier's pull rate if it holds the tokens up to ``upto``, else 0."""
        if self.shared_pull_tokens_per_s is None or shared < upto:
            return 0.0
        return self.shared_pull_tokens_per_s

    def load_rate(self, replica: str) -> float:
        """The replica's CPU -> GPU load rate: reported, else the default."""
        return self._load_rates.get(replica, DEFAULT_KV_LOAD_TOKENS_PER_S)

    def shared(self, replica: str) -> int:
        """The replica's shared prefix; one that has not counted it yet (just started) is
        taken at the others' mean, as for the rate: it holds the shared prompt after its
        first turn, and taken at none it would look a whole prefill behind and get no new
        conversation, so no turn to learn it from."""
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
        """This router sent a turn of ``key`` (of rank ``priority``) to ``replica`` now. Ray's
        routing loop may ask again for the same request (its first choice was full): with
        ``request_id``, the latest choice replaces the earlier, so a turn is counted once."""
        now = self.clock()
        if request_id is not None:
            for earlier in self._sent_as(request_id):
                self._sent[earlier.replica].remove(earlier)
                for backlog in self._backlogs_holding(earlier, now):
                    backlog.tokens = max(0.0, backlog.tokens - earlier.uncached_tokens)
                self._unsettled.add(earlier.replica)  # settled as if it was never sent
        uncached = self.uncached(replica, key, prompt_tokens)
        conversation = stable_hash(key)
        sent = _Sent(replica, conversation, prompt_tokens, uncached, now, request_id, priority)
        self._add(sent)
        self._sent.setdefault(replica, []).append(sent)
        if self._pushes.get(replica, {}).get(REPORTED_AT_KEY, float("-inf")) >= now:
            # A push made since counts it (`_apply_push`): the next delivery leaves it out.
            self._unsettled.add(replica)

    def _sent_as(self, request_id: str) -> list[_Sent]:
        return [
            sent for sents in self._sent.values() for sent in sents if sent.request_id == request_id
        ]

    def _add(self, sent: _Sent) -> None:
        """A turn sent counts in its replica's backlog and in the queue ahead of every rank at
        or after its own (the engine serves it before them; ranks order the deadlines)."""
        rate = self.rate(sent.replica)
        for backlog in self._backlogs_holding(sent, sent.at):
            backlog.tokens += sent.uncached_tokens
            if sent.at > backlog.settled_at:  # as `_drained` drains
                drained = backlog.settled_tokens - rate * (sent.at - backlog.settled_at)
                backlog.settled_tokens = max(0.0, drained)
                backlog.settled_at = sent.at
            backlog.settled_tokens += sent.uncached_tokens

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
        """The replica's backlog drained to ``now`` at its rate."""
        backlog = self._backlogs.get(replica)
        if backlog is None:
            backlog = self._backlogs[replica] = self._new_backlog(0.0, now)
            self._unsettled.add(replica)  # derived again: from the turns sent there, if any
        return self._drained(replica, backlog, now)

    def _drained(self, replica: str, backlog: _Backlog, now: float) -> _Backlog:
        """``backlog`` drained to ``now`` at the replica's rate (the queue ahead of a rank too:
        the engine works through it first)."""
        if backlog.delivery != self._deliveries:  # the first drain since a delivery
            backlog.tokens, backlog.at = backlog.settled_tokens, backlog.settled_at
            backlog.delivery = self._deliveries
        if now > backlog.at:
            backlog.tokens = max(0.0, backlog.tokens - self.rate(replica) * (now - backlog.at))
            backlog.at = now
        return backlog

    def _new_backlog(self, tokens: float, at: float) -> _Backlog:
        return _Backlog(tokens, at, self._deliveries)

    def _ahead_backlogs(self, stats: Mapping[str, Any], at: float) -> dict[int, _Backlog]:
        """The queue ahead of each rank in a replica's report or pushed load (none: an older
        replica, or one that has seen no request)."""
        ahead = stats.get(QUEUED_AHEAD_KEY) or {}
        return {int(rank): self._new_backlog(float(tokens), at) for rank, tokens in ahead.items()}


def _latest_reports(
    known: Mapping[str, Mapping[str, Any]],
    known_at: Mapping[str, float],
    reports: Mapping[str, Mapping[str, Any]],
    latest: dict[str, Mapping[str, Any]],
) -> list[str]:
    """Fills ``latest`` with each listed replica's latest report: the one delivered if newer
    than the one ``known`` (made at ``known_at``, as read: a report is known by its
    ``reported_at``), else the known, in the order listed, the replicas first known now last
    (the order the rates are summed in, for their mean). The replicas whose report is new."""
    renewed: list[str] = []
    first: dict[str, Mapping[str, Any]] = {}
    for replica, stats in reports.items():
        before = known.get(replica)
        reported_at = stats.get(REPORTED_AT_KEY)
        readable = reported_at is not None and QUEUED_KEY in stats
        if before is None:
            if readable:
                first[replica] = stats
        elif readable and reported_at > known_at[replica]:
            latest[replica] = stats
            renewed.append(replica)
        else:
            latest[replica] = before
    latest.update(first)
    return [*renewed, *first]
