"""A request's prompt-cache ttl, honoured by placement: the conversation keeps its home for the
longer of idle_s and that ttl, in a router's own table and in its replica's report (so in every
router's directory), bounded as before; a ttl'd conversation past idle_s is a home, not a load."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.protocol.prompt_cache import TTL_SECONDS
from serve_app.routing.affinity import ConversationPlacer
from serve_app.routing.directory import (
    DEFAULT_MAX_TTL_S,
    REPORT_KEY,
    REPORTED_AT_KEY,
    TTL_KEY,
    ConversationDirectory,
    ConversationTable,
    DirectoryMerger,
    ServedConversations,
)
from serve_app.routing.replica_report import ReplicaReporter
from serve_app.routing.ring import stable_hash
from tests.unit.routing.test_affinity import KEYS, REPLICAS, FakeClock, Replicas

IDLE_S = 300.0
THIRTY_MIN = TTL_SECONDS["30m"]
TWELVE_H = TTL_SECONDS["12h"]


def table(clock: FakeClock, max_conversations: int = 100) -> ConversationTable:
    return ConversationTable(IDLE_S, max_conversations, clock)


def test_the_longest_ttl_kept_is_the_longest_a_request_can_ask() -> None:
    assert DEFAULT_MAX_TTL_S == TWELVE_H == max(TTL_SECONDS.values())


def test_a_ttl_keeps_the_home_past_idle_s_and_no_longer_than_the_ttl() -> None:
    clock = FakeClock()
    homes = table(clock)
    homes.assign("kept", REPLICAS[1], THIRTY_MIN)
    homes.assign("idle", REPLICAS[2])  # no ttl: idle_s, as before
    clock.now = IDLE_S + 1
    assert homes.home("idle") is None
    assert homes.home("kept").replica == REPLICAS[1]
    clock.now = 25 * 60  # a turn 25 minutes later still finds its home
    assert homes.home("kept").replica == REPLICAS[1] and len(homes) == 1
    clock.now = THIRTY_MIN + 1
    assert homes.home("kept") is None and len(homes) == 0


def test_the_latest_requests_ttl_counts_and_an_absurd_one_is_cut_to_max_ttl_s() -> None:
    clock = FakeClock()
    homes = table(clock)
    homes.assign("shortened", REPLICAS[0], TWELVE_H)
    homes.assign("forever", REPLICAS[0], 10 * TWELVE_H)
    clock.now = 10
    homes.assign("shortened", REPLICAS[0])  # the next turn asked none
    clock.now = 10 + IDLE_S + 1
    assert homes.home("shortened") is None
    clock.now = TWELVE_H
    assert homes.home("forever") is not None
    clock.now = TWELVE_H + 1
    assert homes.home("forever") is None


def test_at_the_bound_the_expired_go_first_then_the_least_recently_served_ttl_or_not() -> None:
    clock = FakeClock()
    homes = table(clock, max_conversations=10)
    for key in KEYS[:5]:
        clock.now += 1
        homes.assign(key, REPLICAS[0], TWELVE_H)
    for key in KEYS[5:10]:
        clock.now += 1
        homes.assign(key, REPLICAS[0])
    clock.now += IDLE_S + 1  # the five without a ttl have expired: they make room
    for key in KEYS[10:15]:
        clock.now += 1
        homes.assign(key, REPLICAS[0])
    assert [key for key, _ in homes.sightings()] == KEYS[:5] + KEYS[10:15]
    # Full of live conversations: a ttl reserves nothing, the least recently served go.
    for key in KEYS[15:18]:
        clock.now += 1
        homes.assign(key, REPLICAS[0])
    assert [key for key, _ in homes.sightings()] == KEYS[3:5] + KEYS[10:18]
    assert len(homes) == 10


def test_many_conversations_at_the_bound_stay_bounded_and_in_last_seen_order() -> None:
    clock = FakeClock()
    homes = table(clock, max_conversations=50)
    ttls = [None, THIRTY_MIN, TWELVE_H]
    for index, key in enumerate(KEYS):
        clock.now += 0.5
        homes.assign(key, REPLICAS[index % 8], ttls[index % 3])
    kept = list(homes.sightings())
    assert [key for key, _ in kept] == KEYS[-50:]
    assert all(homes.home(key).ttl_s == (ttls[KEYS.index(key) % 3] or 0) for key, _ in kept)


def test_the_replica_reports_a_ttld_conversation_past_idle_s_with_its_ttl() -> None:
    clock = FakeClock()
    served = ServedConversations("replica-0", idle_s=IDLE_S, clock=clock)
    for key, ttl in ((KEYS[0], THIRTY_MIN), (KEYS[1], None), (KEYS[2], TWELVE_H)):
        served.record(key, ttl)
        clock.now += 1
    served.record(KEYS[3], THIRTY_MIN)
    report = served.report()
    assert report[TTL_KEY] == {
        THIRTY_MIN: [stable_hash(KEYS[0]), stable_hash(KEYS[3])],
        TWELVE_H: [stable_hash(KEYS[2])],
    }
    clock.now = 25 * 60
    report = served.report()
    assert list(report[REPORT_KEY]) == [stable_hash(key) for key in (KEYS[0], KEYS[2], KEYS[3])]
    clock.now = THIRTY_MIN + 4
    assert served.report() == {
        REPORT_KEY: {stable_hash(KEYS[2]): 2},
        TTL_KEY: {TWELVE_H: [stable_hash(KEYS[2])]},
        "reported_at": THIRTY_MIN + 4,
    }


def test_the_engine_replicas_reporter_carries_the_requests_ttl() -> None:
    clock = FakeClock()
    reporter = ReplicaReporter("replica-0", clock=clock)
    reporter.arrived("r1", "conversation", 4860, ttl_s=THIRTY_MIN)
    reporter.arrived("r2", "other", 4860)
    assert reporter.report()[TTL_KEY] == {THIRTY_MIN: [stable_hash("conversation")]}


def test_the_directory_reads_the_ttl_and_counts_only_recent_conversations_active() -> None:
    clock = FakeClock()
    replicas = Replicas(REPLICAS[:2], clock)
    replicas.served[REPLICAS[0]].record(KEYS[0], THIRTY_MIN)
    replicas.served[REPLICAS[1]].record(KEYS[1], THIRTY_MIN)
    clock.now = 25 * 60
    replicas.served[REPLICAS[1]].record(KEYS[2])
    reports = {replica: served.report() for replica, served in replicas.served.items()}
    directory = ConversationDirectory.from_reports(reports, active_since=clock.now - IDLE_S)
    assert directory.home(KEYS[0]).ttl_s == THIRTY_MIN
    assert directory.home(KEYS[2]).ttl_s == 0
    # Two homes kept by their ttl alone hold cache, not work: one active conversation.
    assert directory.active == {REPLICAS[1]: 1}
    assert ConversationDirectory.from_reports(reports).active == {REPLICAS[0]: 1, REPLICAS[1]: 2}
    # One that asked no ttl counts whenever its replica reports it, as before ttls.
    later = ConversationDirectory.from_reports(reports, active_since=clock.now + 1)
    assert later.active == {REPLICAS[1]: 1}


def off_owner(routing: ConversationPlacer, key: str) -> str:
    return next(replica for replica in REPLICAS if replica != routing.ring.owner(key))


def test_a_turn_25_minutes_later_with_ttl_30m_goes_home_through_another_router() -> None:
    """One router placed the conversation off its ring owner; its replica served it asking
    30 minutes. Another router that never saw it reads the reports 25 minutes later."""
    replicas = Replicas()
    other = ConversationPlacer(clock=replicas.clock)
    other.set_members(REPLICAS)
    kept, idle = KEYS[0], KEYS[1]
    home = {key: off_owner(other, key) for key in (kept, idle)}
    replicas.served[home[kept]].record(kept, THIRTY_MIN)
    replicas.served[home[idle]].record(idle)  # asked no ttl
    replicas.clock.now += 25 * 60
    reports = {replica: served.report() for replica, served in replicas.served.items()}
    other.set_reports(reports)
    assert other.knows(kept) and not other.knows(idle)
    assert other.choose(kept, {}, ttl_s=THIRTY_MIN).replica == home[kept]
    assert other.choose(idle, {}).replica == other.ring.owner(idle)
    replicas.clock.now += 5 * 60 + 1  # past the 30 minutes: placed anew
    assert not ConversationPlacer(clock=replicas.clock).knows(kept)
    late = ConversationPlacer(clock=replicas.clock)
    late.set_members(REPLICAS)
    late.set_reports(reports)  # even a report that still names it
    assert late.choose(kept, {}).replica == late.ring.owner(kept)


def test_a_ttl_keeps_the_home_in_the_routers_own_table() -> None:
    """The router placed the conversation off its owner (the owner was busy) and hears no
    reports: 25 minutes on, the ttl'd one goes home, the other to its owner again."""
    clock = FakeClock()
    routing = ConversationPlacer(clock=clock)
    routing.set_members(REPLICAS)
    busy = {routing.ring.owner(key): 10 for key in KEYS[:2]}
    placed = {
        key: routing.choose(key, busy, ttl_s=ttl).replica
        for key, ttl in ((KEYS[0], THIRTY_MIN), (KEYS[1], None))
    }
    assert all(placed[key] != routing.ring.owner(key) for key in KEYS[:2])
    clock.now = 25 * 60
    assert routing.choose(KEYS[0], {}, ttl_s=THIRTY_MIN).replica == placed[KEYS[0]]
    assert routing.choose(KEYS[1], {}).replica == routing.ring.owner(KEYS[1])


def test_moving_a_conversation_kept_by_its_ttl_alone_takes_no_load_off_its_old_home() -> None:
    """Its old home did not count it active (past idle_s), so the move adds one to the new
    replica and takes none from the old: counts never go below what replicas report."""
    replicas = Replicas()
    routing = ConversationPlacer(min_bound=0, clock=replicas.clock)
    routing.set_members(REPLICAS)
    key = KEYS[0]
    home = routing.ring.owner(key)
    replicas.served[home].record(key, THIRTY_MIN)
    replicas.clock.now += 25 * 60
    routing.set_reports({replica: served.report() for replica, served in replicas.served.items()})
    assert routing.directory.active == {}
    busy = {home: 50}  # the home is over the spill bound: the turn moves
    moved = routing.choose(key, busy, ttl_s=THIRTY_MIN).replica
    assert moved != home
    assert routing._active_conversations() == {moved: 1}


# --- merging the reports as Ray delivers them (DirectoryMerger) -------------------------------

MERGE_REPLICAS = ("r0", "r1", "r2", "r3")


@st.composite
def deliveries(draw: st.DrawFn) -> list[tuple[dict[str, dict], float | None, float | None]]:
    """Rounds of reports as Serve hands a router them: each replica's latest (a new one, or
    the same as before: same ``reported_at``, same content), replicas coming and going, with a
    horizon and a recent bound that only move forward (or no horizon). Every sighting's time is
    distinct, as reports' wall clocks are."""
    times = itertools.count(1)
    latest: dict[str, dict] = {}
    rounds = []
    horizon = recent = 0.0
    for _ in range(draw(st.integers(1, 8))):
        for replica in MERGE_REPLICAS:
            action = draw(st.sampled_from(["new", "next", "same", "same", "gone"]))
            if action == "gone":
                latest.pop(replica, None)
            elif action in ("new", "next") or replica not in latest:
                conversations = draw(st.lists(st.integers(0, 11), max_size=8, unique=True))
                seen = {c: float(next(times)) for c in conversations}
                ttl = [c for c in conversations if draw(st.booleans())]
                if action == "next" and replica in latest:  # some kept as they were reported
                    before = latest[replica]
                    before_ttl = {c for cs in before.get(TTL_KEY, {}).values() for c in cs}
                    for c, at in before[REPORT_KEY].items():
                        if c in seen and draw(st.booleans()):
                            seen[c] = at
                            ttl = [t for t in ttl if t != c] + ([c] if c in before_ttl else [])
                report = {REPORT_KEY: seen, REPORTED_AT_KEY: float(next(times))}
                if ttl:
                    report[TTL_KEY] = {THIRTY_MIN: ttl}
                latest[replica] = report
        horizon += draw(st.floats(0, 20))
        recent = max(recent, horizon - draw(st.floats(0, 10)))
        no_horizon = draw(st.booleans()) and draw(st.booleans())
        rounds.append((dict(latest), None if no_horizon else horizon, recent))
    return rounds


@settings(deadline=None)  # a loaded shared machine: time is not what is tested
@given(deliveries())
def test_merging_only_new_reports_gives_the_directory_of_every_report(rounds) -> None:
    merger = DirectoryMerger()
    for reports, active_since, recent_since in rounds:
        merged = merger.merge(reports, active_since, recent_since)
        built = ConversationDirectory.from_reports(reports, active_since)
        assert merged.homes == built.homes
        assert +merged.active == +built.active
        assert merged.reported_at == built.reported_at
        recent = {c: h for c, h in built.homes.items() if h.last_seen >= recent_since}
        assert dict(merged.recent) == recent
        by_time = sorted(recent.values(), key=lambda sighting: sighting.last_seen)
        assert sorted(merged.seen_since(recent_since), key=lambda s: s.last_seen) == by_time


def test_a_report_already_merged_is_not_read_again() -> None:
    class Unreadable(dict):
        def items(self):  # a report's conversations: read once
            raise AssertionError("read again")

    merger = DirectoryMerger()
    first = {REPORT_KEY: {1: 10.0, 2: 11.0}, REPORTED_AT_KEY: 12.0}
    merger.merge({"r0": first})
    # Serve hands the same stats again (another replica's changed): only r1's is read.
    again = {REPORT_KEY: Unreadable(first[REPORT_KEY]), REPORTED_AT_KEY: 12.0}
    merged = merger.merge({"r0": again, "r1": {REPORT_KEY: {2: 13.0}, REPORTED_AT_KEY: 14.0}})
    assert merged.homes[1].replica == "r0" and merged.homes[2].replica == "r1"
    assert merged.active == {"r0": 1, "r1": 1}
