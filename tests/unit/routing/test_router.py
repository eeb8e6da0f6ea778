"""The request router inside Ray Serve's own routing loop, without a cluster.

`PrefixAffinityRouter` is driven by Ray's `RequestRouter` machinery itself (its routing tasks,
at most twice the replicas, each routing one pending request at a time), with stand-ins for
the replicas (ids, routing stats, queue lengths) in place of replica actors. No routing-stats
broadcast happens unless a test sends one, so a request that waits for reports waits for as
long as the router lets it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
import yaml
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, ReplicaID

from serve_app.engines.base import GenerateRequest, SamplingSettings
from serve_app.harmony.render import render_request
from serve_app.protocol.requests import ResponsesRequest
from serve_app.routing import metrics
from serve_app.routing.directory import REPORTED_AT_KEY, ServedConversations
from serve_app.routing.local_routers import await_reported, push_load, wants_loads
from serve_app.routing.prefill import QUEUED_KEY, RATE_KEY
from serve_app.routing.router import PrefixAffinityRouter
from tests.support import MODEL
from tests.support.helpers import REPO
from tests.unit.routing.test_affinity import FakeClock

DEPLOYMENT = DeploymentID(name="EngineDeployment", app_name="router-test")
# Far longer than a test may take: a request that waits for reports at all shows as a stall.
LONG_WAIT_S = 60.0
# Generous: the fixed router routes these at once; the stalled one only after LONG_WAIT_S.
ROUTED_WITHIN_S = 10.0


class StandInReplica:
    """What Ray's routing loop and our router read of a running replica."""

    def __init__(self, unique_id: str, routing_stats: dict[str, Any] | None = None) -> None:
        self.replica_id = ReplicaID(unique_id=unique_id, deployment_id=DEPLOYMENT)
        # By default a report made now, naming no conversation: older than what follows.
        self.routing_stats = routing_stats or ServedConversations(unique_id).report()
        self.max_ongoing_requests = 64
        self.multiplexed_model_ids: set[str] = set()
        self.node_id = "node"
        self.availability_zone = None

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return 0


def make_router(report_wait_s: float = LONG_WAIT_S, **options: Any) -> PrefixAffinityRouter:
    router = PrefixAffinityRouter(
        DEPLOYMENT, DeploymentHandleSource.UNKNOWN, use_replica_queue_len_cache=True
    )
    router.initialize_state(report_wait_s=report_wait_s, **options)
    return router


def prompt(later_turn: bool) -> list[int]:
    """A first turn's prompt, or a later turn's (it holds a message of the model's)."""
    items: list[dict] = [{"role": "user", "content": "hello"}]
    if later_turn:
        items += [
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "again"},
        ]
    request = ResponsesRequest.model_validate({"model": MODEL, "input": items})
    return render_request(request).token_ids


def pending(key: str, later_turn: bool, ttl_s: int | None = None) -> PendingRequest:
    request = GenerateRequest(
        request_id=str(uuid.uuid4()),
        prompt_token_ids=prompt(later_turn),
        sampling=SamplingSettings(max_tokens=8),
        session_id=key,
        cache_ttl_s=ttl_s,
    )
    metadata = RequestMetadata(
        request_id=request.request_id,
        internal_request_id=request.request_id,
        call_method="generate",
        session_id=key,
    )
    return PendingRequest(args=[request], kwargs={}, metadata=metadata)


def route(router: PrefixAffinityRouter, request: PendingRequest) -> asyncio.Task:
    """Hand a request to Ray's routing loop, as a deployment handle does."""
    return asyncio.ensure_future(router._choose_replica_for_request(request))


async def waiting_for_reports(router: PrefixAffinityRouter, count: int) -> None:
    """Until ``count`` requests wait for reports inside the router (event-loop turns only)."""
    for _ in range(1000):
        if router._waiting == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{router._waiting} requests wait for reports, not {count}")


def waits(outcome: str) -> float:
    return metrics.REPORT_WAITS.labels(outcome).value


async def test_one_engine_replica_routes_every_turn_at_once() -> None:
    """With one replica, later turns of conversations no router knows (say, six Codex
    sessions resumed after a pause) and new conversations all arrive at once. Ray runs two
    routing tasks here; before, each such turn waited for reports inside `choose_replicas`
    (up to report_wait_s), so two of them held both tasks and nothing else was routed."""
    router = make_router()
    replica = StandInReplica("only")
    router.update_replicas([replica])
    assert router.max_num_routing_tasks == 2
    later = [route(router, pending(f"resumed-{i}", later_turn=True)) for i in range(6)]
    new = [route(router, pending(f"new-{i}", later_turn=False)) for i in range(3)]
    done, _ = await asyncio.wait(later + new, timeout=ROUTED_WITHIN_S)
    assert len(done) == len(later + new), "routing stalled"
    assert {task.result().replica_id for task in done} == {replica.replica_id}


async def test_waiting_turns_never_hold_every_routing_task() -> None:
    """Two replicas, so a turn may wait for reports; more such turns arrive than Ray has
    routing tasks (four). All but one task may wait: the rest are placed at once, and a new
    conversation arriving behind them is routed while the others still wait."""
    router = make_router()
    replicas = [StandInReplica("a"), StandInReplica("b")]
    router.update_replicas(replicas)
    assert router.max_num_routing_tasks == 4
    skipped_before = waits("skipped")
    later = [route(router, pending(f"elsewhere-{i}", later_turn=True)) for i in range(6)]
    new = route(router, pending("brand-new", later_turn=False))
    done, _ = await asyncio.wait([new], timeout=ROUTED_WITHIN_S)
    assert new in done, "routing stalled behind turns waiting for reports"
    await waiting_for_reports(router, router.max_num_routing_tasks - 1)
    waiting = [task for task in later if not task.done()]
    assert len(waiting) == router.max_num_routing_tasks - 1
    assert waits("skipped") - skipped_before == len(later) - len(waiting)
    # A broadcast naming where the waiting conversations were served lets them go there.
    served = ServedConversations("b")
    for index in range(6):
        served.record(f"elsewhere-{index}")
    router.update_replicas([StandInReplica("a"), StandInReplica("b", served.report())])
    done, _ = await asyncio.wait(waiting, timeout=ROUTED_WITHIN_S)
    assert len(done) == len(waiting)
    assert {task.result().replica_id.unique_id for task in waiting} == {"b"}


async def test_a_wait_ends_as_soon_as_a_report_names_the_conversation() -> None:
    """Replica "b" reports the conversation; "a" has not reported since the turn arrived.
    The turn goes to "b" on that report, not after a whole round (or report_wait_s)."""
    router = make_router()
    a = StandInReplica("a")  # its report stays the one made before the turn arrived
    router.update_replicas([a, StandInReplica("b")])
    found_before = waits("found")
    task = route(router, pending("placed-elsewhere", later_turn=True))
    await waiting_for_reports(router, 1)
    served = ServedConversations("b")
    served.record("placed-elsewhere")
    router.update_replicas([a, StandInReplica("b", served.report())])
    replica = await asyncio.wait_for(task, ROUTED_WITHIN_S)
    assert replica.replica_id.unique_id == "b"
    assert waits("found") == found_before + 1


async def test_a_wait_is_bounded_by_report_wait_s() -> None:
    """No report comes at all: the turn is placed as new after report_wait_s."""
    router = make_router(report_wait_s=0.05)
    router.update_replicas([StandInReplica("a"), StandInReplica("b")])
    timed_out_before = waits("timed_out")
    await asyncio.wait_for(route(router, pending("silent", later_turn=True)), ROUTED_WITHIN_S)
    assert waits("timed_out") == timed_out_before + 1


async def test_a_placement_is_awaited_until_the_reports_name_its_replica() -> None:
    """A prewarm's first turn is placed; its answer waits (`await_reported`) until the
    replicas' reports, which every router receives, name the replica it went to: a report
    naming another replica does not end the wait, one naming that replica does."""
    router = make_router(report_wait_s=LONG_WAIT_S)
    a, b = StandInReplica("a"), StandInReplica("b")
    router.update_replicas([a, b])
    placed = await asyncio.wait_for(
        route(router, pending("prewarmed", later_turn=False)), ROUTED_WITHIN_S
    )
    home = placed.replica_id.unique_id
    other = "b" if home == "a" else "a"
    waiting = asyncio.ensure_future(await_reported("prewarmed"))
    await asyncio.sleep(0.1)
    assert not waiting.done(), "answered before any report named the conversation"
    elsewhere = ServedConversations(other)
    elsewhere.record("prewarmed")  # an older sighting elsewhere is not the placement
    router.update_replicas([StandInReplica(home), StandInReplica(other, elsewhere.report())])
    await asyncio.sleep(0.1)
    assert not waiting.done(), "a report naming another replica ended the wait"
    served = ServedConversations(home)
    served.record("prewarmed")
    router.update_replicas([StandInReplica(home, served.report()), StandInReplica(other)])
    assert await asyncio.wait_for(waiting, ROUTED_WITHIN_S) is True


# Run in a fresh process: cloudpickle gives back the original class in the process that
# pickled it, so only another process sees what an ingress replica gets.
SHIPPED_ROUTER_CHECK = """
import sys
from ray import cloudpickle
from ray.serve._private.common import DeploymentHandleSource, DeploymentID
from serve_app.routing import local_routers
from serve_app.routing.router import PrefixAffinityRouter
shipped = cloudpickle.loads(sys.stdin.buffer.read())
router = shipped(DeploymentID(name="E", app_name="a"), DeploymentHandleSource.UNKNOWN)
router.initialize_state(report_wait_s=1)
print(shipped is PrefixAffinityRouter, list(local_routers._ROUTERS) == [router])
"""


def test_a_router_class_shipped_as_ray_ships_it_is_found_by_the_serving_code() -> None:
    """Ray Serve ships the router class to the ingress replicas by value (cloudpickle), its
    module's globals copied with it: a router built from that copy must still be one the
    serving code's `await_reported` asks (a registry kept in router.py was not: prewarms
    answered at once, and their next turns went to the other engine replica)."""
    shipped = RequestRouterConfig(
        request_router_class="serve_app.routing.router.PrefixAffinityRouter"
    ).get_serialized_request_router_cls()
    checked = subprocess.run(
        [sys.executable, "-c", SHIPPED_ROUTER_CHECK],
        input=shipped,
        capture_output=True,
        timeout=120,
        check=True,
    )
    # A copy of the class, as in an ingress replica, and registered where serving looks.
    assert checked.stdout.decode().split() == ["False", "True"], checked.stderr.decode()[-2000:]


async def test_awaiting_a_placement_is_bounded_and_free_when_nothing_was_placed() -> None:
    """No report comes: False after two report_wait_s. A conversation no router of this
    process placed, or one replica: True at once."""
    router = make_router(report_wait_s=0.05)
    router.update_replicas([StandInReplica("a"), StandInReplica("b")])
    await asyncio.wait_for(route(router, pending("unreported", later_turn=False)), ROUTED_WITHIN_S)
    assert await asyncio.wait_for(await_reported("unreported"), ROUTED_WITHIN_S) is False
    assert await asyncio.wait_for(await_reported("never-placed"), 0.05) is True
    alone = make_router(report_wait_s=LONG_WAIT_S)
    alone.update_replicas([StandInReplica("only")])
    await asyncio.wait_for(route(alone, pending("single", later_turn=False)), ROUTED_WITHIN_S)
    assert await asyncio.wait_for(await_reported("single"), 0.05) is True


async def test_a_turn_within_its_ttl_goes_home_at_once_long_past_idle_s() -> None:
    """The router reads the prompt-cache ttl off the engine request: 25 minutes after a turn
    that asked 30 minutes, the conversation's next turn goes to the same replica at once; one
    that asked none was forgotten after idle_s (300 s), so its next turn waits for reports."""
    clock = FakeClock()
    router = make_router(clock=clock)
    router.update_replicas([StandInReplica("a"), StandInReplica("b")])
    first = await route(router, pending("kept", later_turn=False, ttl_s=30 * 60))
    await route(router, pending("forgotten", later_turn=False))
    clock.now += 25 * 60
    later = await asyncio.wait_for(
        route(router, pending("kept", later_turn=True, ttl_s=30 * 60)), ROUTED_WITHIN_S
    )
    assert later.replica_id == first.replica_id
    waiting = route(router, pending("forgotten", later_turn=True))
    await waiting_for_reports(router, 1)
    waiting.cancel()


def _engine_router_config(config: dict) -> dict:
    (app,) = config["applications"]
    (engine,) = [d for d in app["deployments"] if d["name"] == "EngineDeployment"]
    return engine["request_router_config"]


def _gpu_configs() -> list[tuple[str, dict]]:
    """The Serve configs meant for GPUs: gpt-oss.yaml and the RayService's."""
    rayservice = next(
        doc
        for doc in yaml.safe_load_all((REPO / "k8s" / "rayservice.yaml").read_text())
        if doc["kind"] == "RayService"
    )
    return [
        ("gpt-oss.yaml", yaml.safe_load((REPO / "configs" / "gpt-oss.yaml").read_text())),
        ("k8s/rayservice.yaml", yaml.safe_load(rayservice["spec"]["serveConfigV2"])),
    ]


@pytest.mark.parametrize(("name", "config"), _gpu_configs(), ids=lambda v: str(v)[:20])
def test_gpu_configs_wait_at_most_one_routing_stats_period(name: str, config: dict) -> None:
    router_config = _engine_router_config(config)
    wait_s = router_config["request_router_kwargs"]["report_wait_s"]
    assert 0 < wait_s <= router_config["request_routing_stats_period_s"], name


def test_the_local_config_waits_at_most_two_routing_stats_periods() -> None:
    """The 2-core box configs/local.yaml is for reports late: two periods there."""
    router_config = _engine_router_config(
        yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    )
    wait_s = router_config["request_router_kwargs"]["report_wait_s"]
    assert 0 < wait_s <= 2 * router_config["request_routing_stats_period_s"]


# --- loads the engine replicas push over their channels ---------------------------------------


def _serve_configs() -> list[tuple[str, dict]]:
    """Every shipped Serve config: configs/*.yaml and the RayServices' serveConfigV2."""
    configs = [
        (f"configs/{path.name}", yaml.safe_load(path.read_text()))
        for path in sorted((REPO / "configs").glob("*.yaml"))
    ]
    for manifest in ("k8s/rayservice.yaml", "k8s/shared-kv/rayservice.yaml"):
        documents = yaml.safe_load_all((REPO / manifest).read_text())
        service = next(doc for doc in documents if doc and doc["kind"] == "RayService")
        configs.append((manifest, yaml.safe_load(service["spec"]["serveConfigV2"])))
    return configs


# Where routers place by pushed loads: the shared KV tier's configs, where a move off a queue is
# cheap (docs/routing.md, "Pushed load"), and the CPU default, so the test app runs the path.
PLACES_BY_PUSHED_LOADS = {
    "configs/gpt-oss-shared-kv.yaml",
    "k8s/shared-kv/rayservice.yaml",
    "configs/local.yaml",
}


@pytest.mark.parametrize(("name", "config"), _serve_configs(), ids=lambda v: str(v)[:30])
def test_every_configs_router_options_build_its_router(name: str, config: dict) -> None:
    """Unknown options fail at deploy time; pushed loads are asked for where documented."""
    router = make_router(**_engine_router_config(config)["request_router_kwargs"])
    assert router.wants_loads == (name in PLACES_BY_PUSHED_LOADS), name


def pushed(outcome: str) -> float:
    return metrics.PUSHED_LOADS.labels(outcome).value


def _load(queued: int, at: float) -> dict[str, Any]:
    return {QUEUED_KEY: queued, RATE_KEY: 10_000.0, REPORTED_AT_KEY: at}


@pytest.mark.parametrize("use_pushed_loads", [True, False])
async def test_a_load_pushed_from_another_thread_steers_the_next_new_conversation(
    use_pushed_loads: bool,
) -> None:
    """Both replicas reported empty queues. The new conversation's ring owner then pushes
    (from the ingress's event loop, another thread than the router's) a queue of 10 s of
    prefill, which the other ingress replicas' turns made and no report shows yet: the next
    new conversation goes to the other replica. A push older than the report is stale; two
    pushes of one replica before a choice: the older superseded. A router not placing by
    pushed loads (the default) takes none: the conversation goes to its ring owner."""
    router = make_router(use_pushed_loads=use_pushed_loads)
    assert wants_loads() or not use_pushed_loads
    reported_at = time.time()
    router.update_replicas(
        [StandInReplica(unique_id, _load(0, reported_at)) for unique_id in ("a", "b")]
    )
    owner, other = list(router._placer.ring.walk("new-conversation"))[:2]
    before = {outcome: pushed(outcome) for outcome in ("applied", "stale", "superseded")}

    def ingress_loop() -> None:  # as `HandleEngineClient._read_channel` hands them on
        push_load(owner, _load(50, reported_at + 0.5))  # superseded by the next
        push_load(owner, _load(100_000, reported_at + 1))
        push_load(other, _load(0, reported_at - 1))  # older than its report: stale

    thread = threading.Thread(target=ingress_loop)
    thread.start()
    thread.join()
    placed = await asyncio.wait_for(
        route(router, pending("new-conversation", later_turn=False)), ROUTED_WITHIN_S
    )
    counted = {outcome: pushed(outcome) - before[outcome] for outcome in before}
    if not use_pushed_loads:
        assert placed.replica_id.unique_id == owner
        assert counted == {"applied": 0, "stale": 0, "superseded": 0}
        return
    assert placed.replica_id.unique_id == other
    assert counted == {"applied": 1, "stale": 1, "superseded": 1}


async def test_the_router_places_by_the_requests_tier() -> None:
    """Issue 49: the engine request's rank (its service tier's) reaches the placer, which
    predicts its time to first token by the queue ahead of that rank (tests/unit/routing/
    test_ttft.py)."""
    router = make_router(report_wait_s=0)
    router.update_replicas([StandInReplica("a"), StandInReplica("b")])
    asked: list[int | None] = []
    choose = router._placer.choose

    def spy(*args: Any, priority: int | None = None, **kwargs: Any) -> Any:
        asked.append(priority)
        return choose(*args, priority=priority, **kwargs)

    router._placer.choose = spy  # type: ignore[method-assign]
    for rank in (-1, 1):
        request = pending(f"tiered-{rank}", later_turn=False)
        request.args[0] = dataclasses.replace(request.args[0], priority=rank)
        await asyncio.wait_for(route(router, request), ROUTED_WITHIN_S)
    assert asked == [-1, 1]
