"""Every shipped Serve config schedules service tiers (issue 49), not only accepts them:

- its engine orders its waiting requests by tier: vLLM with its ``priority`` scheduler (the
  engine hands it each request's deadline), the simulated engine always;
- requests beyond the engine's batch (its ``max_num_seqs``) wait in the engine, where they are
  ordered by tier, not in Ray's handle queue, which is first come first served: the engine
  deployment's ``max_ongoing_requests`` leaves room past the batch (and one channel per ingress
  replica);
- flex may not fill the batch (``service_tiers.max_running``), so a flood leaves the other
  tiers room; and the flood does not scale the engines up by itself (the autoscaling policy's
  ``exclude_tiers``, where the config autoscales).

vLLM's own parse of the GPU configs' scheduler options: tests/vllm_cpu/test_vllm_kv_tiers.py."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from serve_app.config import SERVED_TIERS, AppArgs
from serve_app.engines.simulated import SimulatedEngineConfig
from serve_app.engines.vllm_config import VLLMEngineConfig
from tests.deploy.test_deployment import deployments, max_replicas, serve_configs


def _configs() -> list[tuple[str, dict[str, Any]]]:
    from tests.deploy.test_deployment import docs

    shared = docs("shared-kv/rayservice.yaml")["RayService"]["spec"]["serveConfigV2"]
    return [*serve_configs(), ("k8s/shared-kv/rayservice.yaml", yaml.safe_load(shared))]


def _app(config: dict[str, Any]) -> AppArgs:
    (app,) = config["applications"]
    return AppArgs.model_validate(app["args"])


def _engine_batch(args: AppArgs) -> int | None:
    """The engine's batch: its sequences (vLLM) or decode slots (simulated) at once."""
    if args.engine.kind == "vllm":
        return VLLMEngineConfig.model_validate(args.engine.options).max_num_seqs
    return SimulatedEngineConfig.model_validate(args.engine.options).max_num_seqs


@pytest.mark.parametrize(("name", "config"), _configs(), ids=[name for name, _ in _configs()])
def test_the_engine_schedules_the_tiers_and_holds_the_queue(
    name: str, config: dict[str, Any]
) -> None:
    args = _app(config)
    if args.engine.kind == "vllm":
        vllm = VLLMEngineConfig.model_validate(args.engine.options)
        assert vllm.engine_args()["scheduling_policy"] == "priority", name
    batch = _engine_batch(args)
    assert batch is not None, f"{name}: an engine batch without a bound queues nothing by tier"
    engine = deployments(config)["EngineDeployment"]
    ingress = deployments(config)["ResponsesIngress"]
    # One channel per ingress replica, the batch, and at least as many again queued in the
    # engine by tier.
    assert engine["max_ongoing_requests"] >= 2 * batch + max_replicas(ingress), name
    flex = args.service_tiers.max_running.get("flex")
    assert flex is not None and flex < batch, f"{name}: flex may fill the engine's batch"


@pytest.mark.parametrize(("name", "config"), _configs(), ids=[name for name, _ in _configs()])
def test_every_tier_is_served_and_flex_has_its_bound(name: str, config: dict[str, Any]) -> None:
    tiers = _app(config).service_tiers
    # The recorded clients' traffic asks flex and default (tests/deploy/test_traffic_replay.py).
    assert set(tiers.default.allowed) == set(SERVED_TIERS), name
    assert tiers.default.auto == "default"
    deadlines = tiers.deadline_s
    assert deadlines["priority"] < deadlines["default"] < deadlines["flex"] <= 120, name


@pytest.mark.parametrize(("name", "config"), _configs(), ids=[name for name, _ in _configs()])
def test_a_flex_flood_does_not_scale_an_autoscaled_engine_up(
    name: str, config: dict[str, Any]
) -> None:
    engine = deployments(config)["EngineDeployment"]
    autoscaling = engine.get("autoscaling_config")
    if autoscaling is None:
        pytest.skip(f"{name}: a fixed number of engine replicas")
    policy = autoscaling["policy"]
    assert policy["policy_function"].endswith(":GeneratingRequestsPolicy"), name
    assert policy["policy_kwargs"] == {"exclude_tiers": ["flex"]}, name
