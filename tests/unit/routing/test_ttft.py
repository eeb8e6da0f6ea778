"""The TTFT predictor (routing/ttft.py) and the placer's choice by it, on reports made by the
engine replicas' own `ReplicaReporter` (KV summary fed real events, prefill ledger)."""

from __future__ import annotations

import pytest

from serve_app.engines.kv_events import BlockRemoved, BlockStored
from serve_app.routing.affinity import ConversationPlacer
from serve_app.routing.directory import REPORT_KEY
from serve_app.routing.kv_summary import HELD_KEY, KV_EVENTS_KEY
from serve_app.routing.prefill import QUEUED_KEY
from serve_app.routing.replica_report import CPU_HELD_KEY, KV_LOAD_RATE_KEY, ReplicaReporter
from serve_app.routing.ring import Choice, stable_hash
from serve_app.routing.ttft import TTFTPredictor

RATE = 5000  # tokens/s, as each replica measures it below


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _report(clock: Clock, replica: str, queued: int, held: dict[str, int]) -> dict:
    """A replica that measured 5,000 tokens/s, has ``queued`` uncached tokens waiting and
    holds ``held`` tokens of each conversation (by its KV events)."""
    reporter = ReplicaReporter(replica, clock=clock)
    reporter.prefills.arrived("measured", RATE, clock() - 1)
    reporter.prefills.first_token("measured", RATE, clock())
    if queued:
        reporter.prefills.arrived("waiting", queued, clock())
    for key, tokens in held.items():
        blocks = tuple(hash((replica, key, index)) for index in range(tokens // 16))
        reporter.held([BlockStored(blocks, None, 16, key)])
    return reporter.report()


def test_a_prediction_is_the_queue_ahead_plus_the_uncached_prompt_at_the_measured_rate() -> None:
    clock = Clock()
    predictor = TTFTPredictor(clock=clock)
    predictor.update(
        {
            "busy": _report(clock, "busy", queued=5000, held={"c": 4800}),
            "idle": _report(clock, "idle", queued=0, held={}),
        }
    )
    assert predictor.predict("busy", "c", 5000) == pytest.approx((5000 + 200) / RATE)
    assert predictor.predict("idle", "c", 5000) == pytest.approx(5000 / RATE)
    clock.now += 0.5  # the queue drains at the rate meanwhile
    assert predictor.predict("busy", "c", 5000) == pytest.approx((2500 + 200) / RATE)
    # What this router sends counts at once, before the replica reports it.
    predictor.sent("idle", "d", 3000)
    assert predictor.predict("idle", "c", 5000) == pytest.approx((3000 + 5000) / RATE)
    assert predictor.predict("idle", "d", 3100) == pytest.approx((3000 + 100) / RATE)


def _placer(clock: Clock) -> ConversationPlacer:
    placer = ConversationPlacer(clock=clock, ttft_slack_s=0.05)
    placer.set_members(["r1", "r2"])
    return placer


def test_a_turn_stays_home_while_home_is_fastest_and_leaves_a_home_that_evicted_it() -> None:
    clock = Clock()
    placer = _placer(clock)
    loads = {"r1": 1, "r2": 1}
    # Home holds the conversation and has a short queue: the full prefill elsewhere is slower.
    placer.set_reports(
        {
            "r1": _report(clock, "r1", queued=1000, held={"c": 6000}),
            "r2": _report(clock, "r2", queued=0, held={}),
        }
    )
    assert placer.choose("c", loads, 6100).replica == "r1"
    # Under KV pressure home evicted it: the same prefill everywhere, and r1's queue ahead.
    clock.now += 1
    placer.set_reports(
        {
            "r1": _report(clock, "r1", queued=3000, held={}),
            "r2": _report(clock, "r2", queued=0, held={}),
        }
    )
    choice = placer.choose("c", loads, 6100)
    assert (choice.replica, choice.spilled) == ("r2", True)


def test_equal_predictions_go_by_affinity_and_without_a_prompt_nothing_is_predicted() -> None:
    clock = Clock()
    placer = _placer(clock)
    placer.set_reports({replica: _report(clock, replica, 0, {}) for replica in ("r1", "r2")})
    owner = placer.ring.owner("new")
    assert placer.choose("new", {"r1": 0, "r2": 0}, 500).replica == owner
    today = ConversationPlacer(clock=clock, ttft_slack_s=None)
    today.set_members(["r1", "r2"])
    assert today.choose("new", {"r1": 0, "r2": 0}, 500).replica == owner


def test_a_replica_listed_without_its_report_keeps_what_it_reported_last() -> None:
    """Serve lists replicas whose stats it has not passed on (yet): what a home holds is not
    forgotten then, or its conversations would leave their prefix."""
    clock = Clock()
    predictor = TTFTPredictor(clock=clock)
    predictor.update({"home": _report(clock, "home", queued=0, held={"c": 4800})})
    predictor.update({"home": {}, "other": _report(clock, "other", queued=0, held={})})
    assert predictor.predict("home", "c", 5000) == pytest.approx(200 / RATE)
    predictor.update({"other": _report(clock, "other", queued=0, held={})})  # home is gone
    assert predictor.uncached("home", "c", 5000) == 5000


def test_a_request_ray_routes_again_is_counted_once() -> None:
    """Ray's routing loop calls the router again for a request its first choice turned away:
    the latest choice replaces the earlier in the backlog."""
    clock = Clock()
    predictor = TTFTPredictor(clock=clock)
    predictor.update({r: _report(clock, r, queued=0, held={}) for r in ("r1", "r2")})
    predictor.sent("r1", "c", 3000, "request-1")
    predictor.sent("r1", "c", 3000, "request-1")
    assert predictor.predict("r1", "d", 1000) == pytest.approx((3000 + 1000) / RATE)
    predictor.sent("r2", "c", 3000, "request-1")
    assert predictor.predict("r1", "d", 1000) == pytest.approx(1000 / RATE)
    assert predictor.predict("r2", "d", 1000) == pytest.approx((3000 + 1000) / RATE)


def _report_shared(clock: Clock, replica: str, queued: int, held: dict[str, int]) -> dict:
    """As `_report`, from a replica that served ``held``'s conversations and whose cold turns
    found Codex's 4,800-token prompt cached."""
    reporter = ReplicaReporter(replica, clock=clock)
    reporter.arrived("cold", "cold", 4860)
    reporter.first_token("cold", 60, clock())
    reporter.ended("cold")
    for key in held:
        reporter.served.record(key)
    shared = {key: value for key, value in reporter.report().items() if key not in (HELD_KEY,)}
    return {**_report(clock, replica, queued, held), **shared, QUEUED_KEY: queued}


def test_moving_a_conversation_costs_its_own_history_not_the_shared_prompt() -> None:
    """Every replica holds the shared system prompt: a turn sent where its conversation is not
    held computes the rest of its prompt, not all of it. So a young conversation leaves a home
    whose queue ahead costs more than its own history elsewhere, and a long one stays."""
    clock = Clock()
    predictor = TTFTPredictor(clock=clock)
    predictor.update(
        {
            "home": _report_shared(clock, "home", queued=2500, held={"c": 5200, "d": 9900}),
            "idle": _report_shared(clock, "idle", queued=0, held={}),
        }
    )
    assert predictor.uncached("idle", "c", 5300) == 500
    assert predictor.predict("idle", "c", 5300) == pytest.approx(500 / RATE)
    assert predictor.predict("home", "c", 5300) == pytest.approx((2500 + 100) / RATE)
    placer = _placer(clock)
    placer.set_members(["home", "idle"])
    placer.set_reports(
        {
            "home": _report_shared(clock, "home", queued=2500, held={"c": 5200, "d": 9900}),
            "idle": _report_shared(clock, "idle", queued=0, held={}),
        }
    )
    loads = {"home": 2, "idle": 2}
    assert placer.knows("c") and placer.knows("d")
    assert placer.choose("c", loads, 5300) == Choice("idle", spilled=True)
    assert placer.choose("d", loads, 10_000) == Choice("home", spilled=False)  # 5,100 its own


def _evicting_reports(clock: Clock, evicting: bool) -> list[dict[str, dict]]:
    """Two reports a second apart: "home" holds conversation "c" and queues 2,000 tokens,
    "idle" holds none of it and queues nothing, and evicted blocks in between, or not."""
    reports = []
    for removed in (0, 1 if evicting else 0):
        clock.now += 1
        home = _report_shared(clock, "home", queued=2000, held={"c": 6000})
        idle = _report_shared(clock, "idle", queued=0, held={})
        idle[KV_EVENTS_KEY] = {"BlockStored": 3, "BlockRemoved": 5 + removed}
        reports.append({"home": home, "idle": idle})
    return reports


@pytest.mark.parametrize("evicting", [False, True])
def test_a_move_to_a_replica_that_evicts_pays_for_the_prefix_it_would_store_there(
    evicting: bool,
) -> None:
    """A replica whose cache is full (its BlockRemoved count grew since its report before)
    evicts another conversation's prefix for each token a move stores there: the move is
    charged those tokens again. Home: (2,000 queued + 100) / 5,000 = 0.42 s; elsewhere
    1,300 / 5,000 = 0.26 s, plus 1,200 / 5,000 where that evicts."""
    clock = Clock()
    placer = _placer(clock)
    placer.set_members(["home", "idle"])
    for reports in _evicting_reports(clock, evicting):
        placer.set_reports(reports)
    assert placer.predictor.evicting("idle") is evicting
    assert not placer.predictor.evicting("home")
    choice = placer.choose("c", {"home": 2, "idle": 2}, 6100)
    assert choice.replica == ("home" if evicting else "idle")


def test_equal_predictions_go_to_the_replica_holding_most_of_the_conversation() -> None:
    """Under KV pressure the home may have evicted what another replica (an earlier home)
    still holds: among predictions within the slack the turn goes where it adds fewest
    tokens to the caches, before the home. Holder: (600 + 100) / 5,000 = 0.14 s; home, which
    evicted all but the shared prompt: 700 / 5,000 = 0.14 s."""
    clock = Clock()
    placer = _placer(clock)
    placer.set_members(["home", "holder"])
    holder = _report_shared(clock, "holder", queued=600, held={"c": 5400})
    clock.now += 0.001
    home = _report_shared(clock, "home", queued=0, held={})
    home[REPORT_KEY] = {stable_hash("c"): clock()}
    placer.set_reports({"home": home, "holder": holder})
    assert placer.directory.home("c").replica == "home"
    assert placer.choose("c", {"home": 1, "holder": 1}, 5500).replica == "holder"


def test_a_new_conversation_goes_where_fewest_conversations_still_run() -> None:
    """A new conversation holds nothing anywhere, so ties go by the work to come: to the
    replica fewest of whose conversations had a turn within ``live_s`` (their next turns come
    there), not to its ring owner, whose conversations are running while the other's ended a
    minute ago. Today's placer keeps the ring owner; the bound on conversations counts both."""
    clock = Clock()
    placer = _placer(clock)
    owner = placer.ring.owner("new")
    other = "r2" if owner == "r1" else "r1"
    reports = {replica: _report_shared(clock, replica, 0, {}) for replica in ("r1", "r2")}
    reports[owner][REPORT_KEY] = {stable_hash(f"running-{index}"): clock() for index in range(2)}
    reports[other][REPORT_KEY] = {stable_hash(f"ended-{index}"): clock() - 60 for index in range(2)}
    placer.set_reports(reports)
    loads = {"r1": 0, "r2": 0}
    assert placer.choose("new", loads, 4860) == Choice(other, spilled=False, balanced=True)
    today = ConversationPlacer(clock=clock, ttft_slack_s=None)
    today.set_members(["r1", "r2"])
    today.set_reports(reports)
    assert today.choose("new", loads, 4860).replica == owner


def test_a_replica_that_has_not_counted_its_shared_prefix_is_taken_at_the_others() -> None:
    """A replica just added has served no cold turn: taken at no shared prefix, a new
    conversation there would look a whole prefill behind the others, and it would get none
    (nor the turn that would teach it). It is taken at the others' figure, as for the rate."""
    clock = Clock()
    placer = _placer(clock)
    placer.set_members(["busy", "added"])
    placer.set_reports({"busy": _report_shared(clock, "busy", queued=2000, held={})})
    assert placer.predictor.uncached("added", "new", 4860) == 60
    assert placer.choose("new", {"busy": 0, "added": 0}, 4860).replica == "added"


# --- a prefix priced at its cheapest tier (issue 40) -------------------------------------------


def _tier_report(
    clock: Clock,
    replica: str,
    queued: int,
    held: dict[str, int],
    cpu_held: dict[str, int],
    load_rate: float | None = None,
) -> dict:
    """`_report`, the replica also holding ``cpu_held`` tokens of each conversation only in
    its CPU tier (written out, then evicted from the GPU: the offloading connector's events),
    and the conversations' home (it served them)."""
    reporter = ReplicaReporter(replica, clock=clock, kv_load_tokens_per_s=load_rate)
    reporter.prefills.arrived("measured", RATE, clock() - 1)
    reporter.prefills.first_token("measured", RATE, clock())
    if queued:
        reporter.prefills.arrived("waiting", queued, clock())
    for key in held.keys() | cpu_held.keys():
        reporter.served.record(key)
        gpu, cpu = held.get(key, 0) // 16, cpu_held.get(key, 0) // 16
        blocks = tuple(hash((replica, key, index)) for index in range(gpu + cpu))
        reporter.held([BlockStored(blocks, None, 16, key)])
        reporter.held([BlockStored(blocks, None, 16, medium="CPU")])
        reporter.held([BlockRemoved(blocks[gpu:])])
    return reporter.report()


def test_a_prefix_held_only_on_the_replicas_cpu_tier_costs_its_load_time() -> None:
    clock = Clock()
    predictor = TTFTPredictor(clock=clock)
    report = _tier_report(clock, "r1", 0, {"c": 1008}, {"c": 4000}, load_rate=50_000)
    assert report[CPU_HELD_KEY] == {stable_hash("c"): 4000}
    assert report[KV_LOAD_RATE_KEY] == 50_000
    predictor.update({"r1": report})
    # 92 computed; 4,000 loaded at 50,000 tokens/s: 0.08 s, what 400 prefill tokens take
    assert predictor.uncached("r1", "c", 5100) == pytest.approx(92 + 400)
    assert predictor.predict("r1", "c", 5100) == pytest.approx(492 / RATE)
    clock.now += 1  # its next report, of a replica that reports no rate: the default one
    report = _tier_report(clock, "r1", 0, {"c": 1008}, {"c": 4000})
    assert KV_LOAD_RATE_KEY not in report
    predictor.update({"r1": report})
    assert predictor.uncached("r1", "c", 5100) == pytest.approx(92 + 4000 * RATE / 500_000)


def test_a_turn_stays_at_a_home_that_holds_its_prefix_on_cpu_and_leaves_one_that_does_not() -> None:
    clock = Clock()
    placer = _placer(clock)
    loads = {"r1": 1, "r2": 1}
    idle = _report(clock, "r2", queued=0, held={})
    # Home evicted the conversation from its GPU, but its CPU tier holds it: a load (0.06 s)
    # behind 3,000 queued tokens beats a whole prefill on the idle replica.
    home = _tier_report(clock, "r1", 3000, {}, {"c": 6000}, load_rate=500_000)
    placer.set_reports({"r1": home, "r2": idle})
    assert placer.choose("c", loads, 6100).replica == "r1"
    # Without the CPU tier it would have recomputed it there: it goes to the idle replica.
    clock.now += 1
    placer.set_reports({"r1": _report(clock, "r1", 3000, {}), "r2": _report(clock, "r2", 0, {})})
    assert placer.choose("c", loads, 6100).replica == "r2"


@pytest.mark.parametrize("pull_rate", [None, 190_000.0])
def test_a_warm_turn_queued_at_home_moves_when_its_prefix_can_follow_through_the_shared_tier(
    pull_rate: float | None,
) -> None:
    """Home holds 6,000 tokens of the conversation behind 5,000 queued (1.02 s); an idle
    replica would recompute them (1.22 s), or, with a shared tier, pull them (0.05 s)."""
    clock = Clock()
    placer = ConversationPlacer(
        clock=clock, ttft_slack_s=0.05, shared_kv_pull_tokens_per_s=pull_rate
    )
    placer.set_members(["r1", "r2"])
    placer.set_reports(
        {
            "r1": _tier_report(clock, "r1", 5000, {"c": 6000}, {}),
            "r2": _report(clock, "r2", queued=0, held={}),
        }
    )
    pulled = 100 + 6000 * RATE / 190_000
    assert placer.knows("c")
    idle_ttft = placer.predictor.predict("r2", "c", 6100)
    assert idle_ttft == pytest.approx((6100 if pull_rate is None else pulled) / RATE)
    choice = placer.choose("c", {"r1": 1, "r2": 0}, 6100)
    assert (choice.replica, choice.spilled) == (
        ("r1", False) if pull_rate is None else ("r2", True)
    )
    if pull_rate is not None:  # the pull is the idle replica's queue now, as the engine runs it
        assert placer.predictor.predict("r2", "d", 1000) == pytest.approx((pulled + 1000) / RATE)


def test_the_replicas_queue_counts_a_cpu_load_in_prefill_tokens_of_the_same_time() -> None:
    clock = Clock()
    reporter = ReplicaReporter("r1", clock=clock, kv_load_tokens_per_s=50_000)
    reporter.prefills.arrived("measured", RATE, clock() - 1)
    reporter.prefills.first_token("measured", RATE, clock())
    blocks = tuple(range(100))
    reporter.held([BlockStored(blocks, None, 16, "c"), BlockStored(blocks, None, 16, medium="CPU")])
    reporter.held([BlockRemoved(blocks[50:])])  # 800 tokens on the GPU, 800 more on CPU only
    reporter.arrived("turn", "c", 1700)
    assert reporter.report()[QUEUED_KEY] == 100 + 800 * RATE // 50_000


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_a_shared_tier_pull_rate_must_be_positive(rate: float) -> None:
    with pytest.raises(ValueError, match="shared_kv_pull_tokens_per_s"):
        ConversationPlacer(shared_kv_pull_tokens_per_s=rate)


def _pushed_load(clock: Clock, queued: int) -> dict:
    """The load a replica that measured 5,000 tokens/s pushes with ``queued`` tokens waiting."""
    reporter = ReplicaReporter("r", clock=clock)
    reporter.prefills.arrived("measured", RATE, clock() - 1)
    reporter.prefills.first_token("measured", RATE, clock())
    if queued:
        reporter.prefills.arrived("waiting", queued, clock())
    return reporter.load()


def test_a_pushed_load_shows_the_turns_other_routers_sent_since_the_report() -> None:
    """Between reports a replica's queue grows with the other ingress replicas' turns: its
    pushed load says so, drained from when it was taken; this router's own turns sent after
    the push still count, those sent before are in it already."""
    clock = Clock()
    predictor = TTFTPredictor(clock=clock)
    predictor.update({r: _report(clock, r, queued=0, held={}) for r in ("r1", "r2")})
    predictor.sent("r1", "mine-before", 1000)
    clock.now += 0.1
    predictor.pushed("r1", _pushed_load(clock, queued=6000))  # the other router's 5,000 too
    assert predictor.predict("r1", "d", 500) == pytest.approx((6000 + 500) / RATE)
    clock.now += 0.2
    predictor.sent("r1", "mine-after", 2000)
    assert predictor.predict("r1", "d", 500) == pytest.approx((5000 + 2000 + 500) / RATE)
    assert predictor.predict("r2", "d", 500) == pytest.approx(500 / RATE)  # no push: its report
    # A round of reports made before the push does not undo it.
    clock.now += 0.1
    reports = {r: _report(clock, r, queued=0, held={}) for r in ("r1", "r2")}
    for report in reports.values():
        report["reported_at"] = clock() - 0.35  # made before the push, delivered after
    predictor.update(reports)
    assert predictor.predict("r1", "d", 500) == pytest.approx((4500 + 2000 + 500) / RATE)


def test_a_report_newer_than_the_push_replaces_it_and_stale_pushes_are_ignored() -> None:
    clock = Clock()
    predictor = TTFTPredictor(clock=clock)
    predictor.pushed("r1", _pushed_load(clock, queued=9000))  # no report of r1 yet: ignored
    predictor.update({"r1": _report(clock, "r1", queued=0, held={})})
    assert predictor.predict("r1", "d", 500) == pytest.approx(500 / RATE)
    old = _pushed_load(clock, queued=9000)
    old["reported_at"] = clock() - 0.5  # taken before the report
    predictor.pushed("r1", old)
    assert predictor.predict("r1", "d", 500) == pytest.approx(500 / RATE)
    clock.now += 0.1
    newer = _pushed_load(clock, queued=3000)
    clock.now += 0.05
    predictor.pushed("r1", newer)
    predictor.pushed("r1", {**old, "reported_at": newer["reported_at"] - 0.01})  # overtaken
    assert predictor.predict("r1", "d", 500) == pytest.approx((3000 - 250 + 500) / RATE)
    clock.now += 0.1
    predictor.update({"r1": _report(clock, "r1", queued=1000, held={})})
    assert predictor.predict("r1", "d", 500) == pytest.approx((1000 + 500) / RATE)


def test_the_placer_moves_a_turn_off_a_home_the_other_routers_filled_once_it_is_pushed() -> None:
    """Two ingress routers: the other one filled the conversation's home since the last
    report. Its pushed load sends the turn to the idle replica (a shared tier: the move costs
    a pull); without the push the turn goes home behind the queue."""
    clock = Clock()
    placers = [
        ConversationPlacer(clock=clock, ttft_slack_s=0.05, shared_kv_pull_tokens_per_s=30_000)
        for _ in range(2)
    ]
    reports = {
        "r1": _report(clock, "r1", queued=0, held={"c": 4800}),
        "r2": _report(clock, "r2", queued=0, held={}),
    }
    reports["r1"][REPORT_KEY] = {stable_hash("c"): clock()}
    for placer in placers:
        placer.set_members(["r1", "r2"])
        placer.set_reports(reports)
    clock.now += 0.1
    full = _pushed_load(clock, queued=20_000)
    placers[0].predictor.pushed("r1", full)
    assert placers[0].choose("c", {"r1": 5, "r2": 0}, 5000).replica == "r2"
    assert placers[1].choose("c", {"r1": 5, "r2": 0}, 5000).replica == "r1"


def _tiered_report(clock: Clock, replica: str, flex_queued: int, held: dict[str, int]) -> dict:
    """A replica measured at 5,000 tokens/s, with ``flex_queued`` uncached tokens of flex
    requests (deadline 60 s) waiting, and a priority request seen earlier (so it reports the
    queue ahead of each of the two ranks)."""
    reporter = ReplicaReporter(replica, clock=clock)
    reporter.prefills.arrived("measured", RATE, clock() - 1, deadline_s=0.0, priority=-1)
    reporter.prefills.first_token("measured", RATE, clock())
    if flex_queued:
        reporter.prefills.arrived("flood", flex_queued, clock(), deadline_s=60.0, priority=1)
    for key, tokens in held.items():
        blocks = tuple(hash((replica, key, index)) for index in range(tokens // 16))
        reporter.held([BlockStored(blocks, None, 16, key)])
    return reporter.report()


def test_a_priority_turn_stays_home_behind_a_flex_queue_it_goes_ahead_of() -> None:
    """Issue 49: home holds the conversation and 20,000 tokens of flex prefill queued (4 s);
    the other replica is idle. A priority turn goes ahead of the flood there, so home is
    fastest for it (100 tokens); a flex turn would wait for the flood, so it moves, as a turn
    whose rank the replica reports nothing for (the whole queue counts)."""
    clock = Clock()
    placer = _placer(clock)
    loads = {"r1": 1, "r2": 1}
    placer.set_reports(
        {
            "r1": _tiered_report(clock, "r1", flex_queued=20_000, held={"c": 6000}),
            "r2": _tiered_report(clock, "r2", flex_queued=0, held={}),
        }
    )
    predictor = placer.predictor
    assert predictor.predict("r1", "c", 6100, priority=-1) == pytest.approx(100 / RATE)
    assert predictor.predict("r1", "c", 6100, priority=1) == pytest.approx(20_100 / RATE)
    assert predictor.predict("r1", "c", 6100) == pytest.approx(20_100 / RATE)
    assert placer.choose("c", loads, 6100, priority=-1).replica == "r1"
    assert placer.choose("d", loads, 6100, priority=1).replica == "r2"


def test_a_turn_sent_counts_ahead_of_the_ranks_at_or_after_its_own() -> None:
    """What this router sends before the replica reports it: a priority turn is ahead of every
    later turn; a flex one only of later flex turns (and of those the replica ranks none for)."""
    clock = Clock()
    predictor = TTFTPredictor(clock=clock)
    predictor.update({"r": _tiered_report(clock, "r", flex_queued=0, held={})})
    predictor.sent("r", "flex-turn", 3000, priority=1)
    assert predictor.predict("r", "x", 100, priority=-1) == pytest.approx(100 / RATE)
    assert predictor.predict("r", "x", 100, priority=1) == pytest.approx(3100 / RATE)
    predictor.sent("r", "urgent-turn", 1000, priority=-1)
    assert predictor.predict("r", "x", 100, priority=-1) == pytest.approx(1100 / RATE)
    assert predictor.predict("r", "x", 100) == pytest.approx(4100 / RATE)
