"""Routing metrics (``serve_app.telemetry``). They are recorded in the process that routes: the
ingress replica holding the engine handle, so on Ray's metrics export they carry that ingress
replica's tags (``replica``, ``deployment``), and the engine replica they are about is the
``engine_replica`` label (Serve reserves ``replica``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from serve_app.routing.ring import Choice
from serve_app.telemetry import Counter, Gauge

ROUTING_DECISIONS = Counter(
    "serve_app_routing_decisions",
    "Engine requests by routing decision: owner (the conversation's home replica, or for a "
    "new conversation its ring owner, took it), balanced (a new conversation placed off its "
    "ring owner to even the load; it moves no cache), spilled (a known conversation moved off "
    "its home, for load), no_key (no session id).",
    ["decision"],
)
REPORT_WAITS = Counter(
    "serve_app_routing_report_waits",
    "Later turns of conversations unknown to this router that waited for a round of the "
    "engine replicas' reports, by outcome: found (a replica served it), unknown (none did: "
    "placed as new), timed_out (no round within report_wait_s), skipped (placed at once, as "
    "new: all of Ray's routing tasks but one were waiting already).",
    ["outcome"],
)
PUSHED_LOADS = Counter(
    "serve_app_routing_pushed_loads",
    "Loads the engine replicas pushed over their channels to this ingress, by outcome at this "
    "router's next choice: applied (newer than the replica's report: its queue now), stale "
    "(not newer than its report or last push, or a replica it has no report of), superseded "
    "(a newer load of the same replica came before the choice).",
    ["outcome"],
)
REPLICA_ONGOING = Gauge(
    "serve_app_engine_replica_ongoing_requests",
    "Ongoing requests per engine replica, as the router last saw them.",
    ["engine_replica"],
)
REPLICA_CONVERSATIONS = Gauge(
    "serve_app_engine_replica_reported_conversations",
    "Conversations each engine replica served within idle_s, by its latest routing-stats "
    "report as this router received it (a conversation on several counts on the latest).",
    ["engine_replica"],
)

REPLICA_PROMPT_TOKENS = Counter(
    "serve_app_engine_replica_prompt_tokens",
    "Prompt tokens sent to each engine replica.",
    ["engine_replica"],
)
REPLICA_CACHED_TOKENS = Counter(
    "serve_app_engine_replica_prefix_cache_hit_tokens",
    "Prompt tokens each engine replica served from its prefix cache.",
    ["engine_replica"],
)


def _set_per_replica(gauge: Gauge, values: Mapping[str, int]) -> None:
    # Replicas that are gone (scaled down, restarted) are removed, so the gauge stays truthful.
    gauge.set_all({(replica,): value for replica, value in values.items()})


def record_loads(loads: Mapping[str, int]) -> None:
    _set_per_replica(REPLICA_ONGOING, loads)


def record_reported_conversations(replicas: Iterable[str], active: Mapping[str, int]) -> None:
    _set_per_replica(
        REPLICA_CONVERSATIONS, {replica: active.get(replica, 0) for replica in replicas}
    )


def record_pushed(applied: int, stale: int, superseded: int) -> None:
    for outcome, count in (("applied", applied), ("stale", stale), ("superseded", superseded)):
        if count:
            PUSHED_LOADS.labels(outcome).inc(count)


def record_decision(choice: Choice) -> None:
    decision = "balanced" if choice.balanced else "spilled" if choice.spilled else "owner"
    ROUTING_DECISIONS.labels(decision).inc()


def record_prompt(replica: str | None, prompt_tokens: int, cached_tokens: int) -> None:
    if replica is None:
        return
    REPLICA_PROMPT_TOKENS.labels(replica).inc(prompt_tokens)
    REPLICA_CACHED_TOKENS.labels(replica).inc(cached_tokens)
