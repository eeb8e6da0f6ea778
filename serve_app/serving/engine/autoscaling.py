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
        policy_function: serve_app.serving.engine.autoscaling:generating_requests_policy

Ray pickles this module by value into the controller: it imports nothing of serve_app's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

# The custom autoscaling metric each engine replica reports (`EngineDeployment`).
GENERATING_REQUESTS = "generating_requests"


def generating_requests_policy(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    """Replicas wanted: (requests generating + requests queued at the handles) divided by
    ``target_ongoing_requests``, as Ray's default policy divides all ongoing requests.

    A replica not reporting yet (just started) counts as generating nothing. With no
    replica reporting at all (the metric missing: an engine deployment that does not report
    it), it falls back to Ray's count of ongoing requests, so autoscaling never stops."""
    if ctx.current_num_replicas == 0:
        return ctx.target_num_replicas, {}
    target = ctx.config.get_target_ongoing_requests()
    reported = (ctx.aggregated_metrics or {}).get(GENERATING_REQUESTS) or {}
    running = set(ctx.running_replicas)
    generating = [value for replica, value in reported.items() if replica in running]
    if not generating:
        return ctx.total_num_requests / target, {}
    queued = ctx.total_queued_requests or 0.0
    return (sum(generating) + queued) / target, {}
