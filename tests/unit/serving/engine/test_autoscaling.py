"""The engine deployment autoscales on the requests generating, not on its open channels.

Unit level, no Ray cluster: the engine deployment's class with the simulated engine reports
its custom autoscaling metric while channels are open, and the policy
(``serve_app.serving.engine.autoscaling``) decides through Ray's own wrapper (delays, factors,
bounds), on an `AutoscalingContext` as Ray's controller builds it. A serve-tier test would wait
out Ray's metrics push and look-back windows and a replica start (minutes on this machine) to
show the same decision.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from ray.serve._private.common import DeploymentID
from ray.serve.autoscaling_policy import (
    _apply_autoscaling_config,
    replica_queue_length_autoscaling_policy,
)
from ray.serve.config import AutoscalingConfig, AutoscalingContext
from ray.serve.request_router import ReplicaID

from serve_app.engines.base import GenerateRequest, SamplingSettings
from serve_app.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from serve_app.protocol.service_tiers import PRIORITY
from serve_app.serving.engine.autoscaling import (
    GENERATING_REQUESTS,
    TIERS,
    GeneratingRequestsPolicy,
    generating_requests_policy,
    tier_metric,
)
from serve_app.serving.engine.deployment import EngineDeployment
from tests.support.helpers import REPO

DEPLOYMENT = DeploymentID(name="EngineDeployment", app_name="serve_app")
INGRESS_REPLICAS = 4  # configs/gpt-oss.yaml's ResponsesIngress max_replicas


class _BareReplica(EngineDeployment.func_or_class):  # type: ignore[name-defined,misc]
    def __del__(self) -> None:
        pass


@pytest.fixture
async def replica() -> AsyncIterator[Any]:
    engine = SimulatedEngine(SimulatedEngineConfig(decode_tokens_per_s=50))
    await engine.start()
    callers = {f"ingress-{index}" for index in range(INGRESS_REPLICAS)}

    async def alive() -> set[str]:
        return callers

    bare = _BareReplica.__new__(_BareReplica)
    bare._serve(engine, "engine-1", alive)
    yield bare
    await engine.shutdown()


async def _drain(stream: AsyncIterator[Any]) -> None:
    async for _ in stream:
        pass


async def test_open_channels_are_not_reported_as_generating(replica: Any) -> None:
    """Four ingress replicas hold a channel each and three requests generate: Serve counts
    seven calls in flight on the replica, the replica reports three generating."""
    calls: list[asyncio.Task] = [
        asyncio.create_task(_drain(replica.channel(f"ingress-{index}", "engine-1")))
        for index in range(INGRESS_REPLICAS)
    ]
    prompt = [200006, 1428, 200008, 12194, 200007]
    for index in range(3):
        request = GenerateRequest(f"r{index}", prompt, SamplingSettings(max_tokens=1000))
        generate = replica.generate(request, caller=f"ingress-{index}")
        calls.append(asyncio.create_task(_drain(generate)))
    for _ in range(200):
        if replica._engine.num_ongoing_requests() == 3:
            break
        await asyncio.sleep(0.01)
    in_flight = sum(not call.done() for call in calls)  # what Serve counts as ongoing
    assert in_flight == INGRESS_REPLICAS + 3
    assert (await replica.record_autoscaling_stats())[GENERATING_REQUESTS] == 3
    for call in calls:
        call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*calls, return_exceptions=True)
    for _ in range(200):
        if replica._engine.num_ongoing_requests() == 0:
            break
        await asyncio.sleep(0.01)
    assert (await replica.record_autoscaling_stats())[GENERATING_REQUESTS] == 0


def _context(
    generating: dict[str, float] | None, ongoing: float, queued: float = 0.0
) -> AutoscalingContext:
    """What Ray's controller hands a policy for one engine deployment of ``len(replicas)``
    running replicas: ``ongoing`` is its own count (channels included), ``generating`` the
    replicas' custom metric (None: no replica reports it)."""
    replicas = sorted(generating or {"a": 0})
    ids = {name: ReplicaID(unique_id=name, deployment_id=DEPLOYMENT) for name in replicas}
    config = AutoscalingConfig(
        min_replicas=1, max_replicas=8, target_ongoing_requests=24, upscale_delay_s=0
    )
    metrics = None
    if generating is not None:
        metrics = {GENERATING_REQUESTS: {ids[name]: value for name, value in generating.items()}}
    return AutoscalingContext(
        deployment_id=DEPLOYMENT,
        deployment_name=DEPLOYMENT.name,
        app_name=DEPLOYMENT.app_name,
        current_num_replicas=len(ids),
        target_num_replicas=len(ids),
        running_replicas=list(ids.values()),
        total_num_requests=ongoing,
        total_queued_requests=queued,
        aggregated_metrics=metrics,
        raw_metrics=None,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=8,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=None,
        config=config,
    )


def _decide(policy: Any, context: AutoscalingContext) -> int:
    """The number of replicas Ray's controller would set (its wrapper around any policy)."""
    replicas, _ = _apply_autoscaling_config(policy)(context)
    return replicas


def test_channels_do_not_scale_the_engine_up() -> None:
    """One replica generating 21 requests (under the target of 24) with four channels open:
    Ray's default policy counts 25 and adds a replica; ours keeps one."""
    context = _context({"a": 21}, ongoing=21 + INGRESS_REPLICAS)
    assert _decide(replica_queue_length_autoscaling_policy, context) == 2
    context = _context({"a": 21}, ongoing=21 + INGRESS_REPLICAS)
    assert _decide(generating_requests_policy, context) == 1


def test_generating_and_queued_requests_still_scale_the_engine_up() -> None:
    """Two replicas generating 30 each and 20 queued at the handles: 80 over a target of 24
    wants four replicas, as Ray's policy would without the channels."""
    context = _context({"a": 30, "b": 30}, ongoing=80 + 2 * INGRESS_REPLICAS, queued=20)
    assert _decide(generating_requests_policy, context) == 4


def test_without_the_metric_the_policy_falls_back_to_rays_count() -> None:
    context = _context(None, ongoing=60)
    assert _decide(generating_requests_policy, context) == 3


def test_the_gpu_config_scales_the_engine_on_generating_requests() -> None:
    app = yaml.safe_load((REPO / "configs" / "gpt-oss.yaml").read_text())["applications"][0]
    (engine,) = [d for d in app["deployments"] if d["name"] == "EngineDeployment"]
    policy = engine["autoscaling_config"]["policy"]["policy_function"]
    assert policy == "serve_app.serving.engine.autoscaling:GeneratingRequestsPolicy"


# -- Service tiers (issue 49) -------------------------------------------------------------------


async def test_the_replica_reports_its_generating_requests_by_tier(replica: Any) -> None:
    """Beside the total, each tier's count (the engine requests' rank: PRIORITY), which a policy
    told to leave flex out subtracts; and the engine's queue wait is recorded by tier."""
    prompt = [200006, 1428, 200008, 12194, 200007]
    waits_before = REGISTRY.get_sample_value(
        "serve_app_engine_queue_wait_seconds_count", {"tier": "flex"}
    )
    calls = []
    for index, tier in enumerate(["flex", "flex", "priority"]):
        request = GenerateRequest(
            f"t{index}", prompt, SamplingSettings(max_tokens=1000), priority=PRIORITY[tier]
        )
        calls.append(asyncio.create_task(_drain(replica.generate(request, caller="ingress-0"))))
    for _ in range(200):
        if replica._engine.num_ongoing_requests() == 3:
            break
        await asyncio.sleep(0.01)
    stats = await replica.record_autoscaling_stats()
    assert stats == {
        GENERATING_REQUESTS: 3,
        tier_metric("priority"): 1,
        tier_metric("default"): 0,
        tier_metric("flex"): 2,
    }
    running = REGISTRY.get_sample_value(
        "serve_app_engine_running_requests_by_tier", {"tier": "flex"}
    )
    assert running == 2
    for _ in range(200):  # their first tokens, which carry the queue wait
        waits = REGISTRY.get_sample_value(
            "serve_app_engine_queue_wait_seconds_count", {"tier": "flex"}
        )
        if waits == (waits_before or 0) + 2:
            break
        await asyncio.sleep(0.01)
    assert waits == (waits_before or 0) + 2
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    for _ in range(200):
        if replica._engine.num_ongoing_requests() == 0:
            break
        await asyncio.sleep(0.01)
    assert (await replica.record_autoscaling_stats())[tier_metric("flex")] == 0


def _tiered(generating: dict[str, float], flex: dict[str, float], queued: float = 0.0):
    context = _context(generating, ongoing=sum(generating.values()), queued=queued)
    ids = {replica.unique_id: replica for replica in context.running_replicas}
    assert context.aggregated_metrics is not None
    context.aggregated_metrics[tier_metric("flex")] = {
        ids[name]: value for name, value in flex.items()
    }
    return context


def test_a_flex_flood_does_not_scale_the_engine_up_when_the_operator_says_so() -> None:
    """Two replicas generating 40 each, 60 of the 80 flex: scaled on all, 80 over a target of 24
    wants four replicas; with flex left out, the 20 others want one, so the two stay (until
    the downscale delay)."""
    flood = {"a": 30.0, "b": 30.0}
    every_tier = GeneratingRequestsPolicy()
    assert _decide(every_tier, _tiered({"a": 40, "b": 40}, flood)) == 4
    assert _decide(generating_requests_policy, _tiered({"a": 40, "b": 40}, flood)) == 4
    without_flex = GeneratingRequestsPolicy(exclude_tiers=["flex"])
    assert _decide(without_flex, _tiered({"a": 40, "b": 40}, flood)) == 2
    # The other tiers still scale it: 100 priority and default requests want five.
    assert _decide(without_flex, _tiered({"a": 80, "b": 80}, flood)) == 5


def test_the_policy_refuses_a_tier_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="exclude_tiers"):
        GeneratingRequestsPolicy(exclude_tiers=["batch"])


def test_the_configs_policy_is_the_class_and_takes_its_kwargs() -> None:
    """The GPU configs name the class with `policy_kwargs` (Ray instantiates a class policy
    with them: ray/serve/_private/autoscaling_state.py ``_resolve_policy_callable``)."""
    from ray.serve.config import AutoscalingPolicy

    for name in ("gpt-oss.yaml", "gpt-oss-shared-kv.yaml"):
        app = yaml.safe_load((REPO / "configs" / name).read_text())["applications"][0]
        (engine,) = [d for d in app["deployments"] if d["name"] == "EngineDeployment"]
        policy = AutoscalingPolicy(**engine["autoscaling_config"]["policy"])
        raw = policy.get_policy()
        assert raw.__name__ == "GeneratingRequestsPolicy"
        assert raw(**policy.policy_kwargs).exclude_tiers == ("flex",), name


def test_the_policy_spells_the_tiers_as_the_app_does() -> None:
    from serve_app.config import SERVED_TIERS

    assert TIERS == SERVED_TIERS
