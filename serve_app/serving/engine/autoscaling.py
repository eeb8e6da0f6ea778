"""The engine deployment's autoscaling: on the requests generating, not Serve's ongoing count.

Ray Serve's default policy scales on ongoing requests per replica, as the deployment handles
count them: every handle call in flight. Among those are the engine channels
(``serve_app.serving.engine.channel``): one streamed call per (engine replica, ingress
replica) that carries its requests' tokens and stays open until 2 s idle. They generate
nothing, yet with 4 ingress replicas each engine replica counts up to 4 more: at
``target_ongoing_requests`` 24, one replica generating 21 counted 25 and was scaled up.

So each engine replica reports the requests its engine holds (``record_autoscaling_stats``,
Ray Serve's custom autoscaling metrics: ``generating_requests``, pushed to the controller and
averaged over ``look_back_period_s`` like the built-in count), and this policy sizes the
deployment on those plus the requests queued at the handles, against the same
``target_ongoing_requests``. Ray wraps it as it wraps its own: ``upscale_delay_s``,
``downscale_delay_s``, the scaling factors and ``min_replicas``/``max_replicas`` still apply.

    autoscaling_config:
      target_ongoing_requests: 24
      policy:
        policy_function: serve_app.serving.engine.autoscaling:GeneratingRequestsPolicy
        policy_kwargs: {exclude_tiers: [flex]}

Service tiers (issue 49): each replica also reports its generating requests per tier
(``generating_requests_<tier>``), and the policy leaves the tiers the operator names in
``exclude_tiers`` out of the load it scales on, so a flex flood alone does not scale the
deployment up (it waits in the engines' queues, behind the other tiers, until they have room).
The requests queued at the handles are counted whole: Ray counts them without their tier. Ray
instantiates a class policy once with its ``policy_kwargs`` and calls it each tick.
``generating_requests_policy`` is the class with no tier left out.

Ray pickles this module by value into the controller: it imports nothing of serve_app's (so the
tiers' names are spelled here too; tests/unit/serving/engine/test_autoscaling.py compares them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

# The custom autoscaling metrics each engine replica reports (`EngineDeployment`): all its
# requests generating, and those of each service tier (serve_app.config.SERVED_TIERS).
GENERATING_REQUESTS = "generating_requests"
TIERS = ("priority", "default", "flex")


def tier_metric(tier: str) -> str:
    """The custom metric of one tier's generating requests."""
    return f"{GENERATING_REQUESTS}_{tier}"


class GeneratingRequestsPolicy:
    """Replicas wanted: (requests generating, less those of ``exclude_tiers``, + requests
    queued at the handles) divided by ``target_ongoing_requests``, as Ray's default policy
    divides all ongoing requests.

    A replica not reporting yet (just started) counts as generating nothing. With no replica
    reporting at all (the metric missing: an engine deployment that does not report it), it
    falls back to Ray's count of ongoing requests, so autoscaling never stops."""

    def __init__(self, exclude_tiers: Iterable[str] = ()) -> None:
        self.exclude_tiers = tuple(exclude_tiers)
        unknown = sorted(set(self.exclude_tiers) - set(TIERS))
        if unknown:
            raise ValueError(f"exclude_tiers: {unknown} are not tiers (one of {TIERS})")

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
        if ctx.current_num_replicas == 0:
            return ctx.target_num_replicas, {}
        target = ctx.config.get_target_ongoing_requests()
        metrics = ctx.aggregated_metrics or {}
        running = set(ctx.running_replicas)
        generating = _reported(metrics, GENERATING_REQUESTS, running)
        if not generating:
            return ctx.total_num_requests / target, {}
        left_out = sum(
            sum(_reported(metrics, tier_metric(tier), running)) for tier in self.exclude_tiers
        )
        queued = ctx.total_queued_requests or 0.0
        return (max(sum(generating) - left_out, 0.0) + queued) / target, {}


def _reported(metrics: dict[str, Any], name: str, running: set[Any]) -> list[float]:
    """The running replicas' values of one custom metric (a replica gone is not counted)."""
    return [value for replica, value in (metrics.get(name) or {}).items() if replica in running]


def generating_requests_policy(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    """Every tier counted: the policy before service tiers, under its old name (a config may
    still name this function)."""
    return GeneratingRequestsPolicy()(ctx)
