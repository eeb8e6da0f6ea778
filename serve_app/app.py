"""The application builder: ``serve run configs/local.yaml`` imports ``build_app`` from here.

No ``from __future__ import annotations`` here: Ray Serve reads the real ``AppArgs`` class from
the signature to validate the config's ``args``.
"""

from ray.serve import Application

from serve_app.config import AppArgs
from serve_app.serving.engine.deployment import EngineDeployment
from serve_app.serving.ingress import ResponsesIngress

MODERATION_DEPLOYMENT = "ModerationEngine"


def build_app(args: AppArgs) -> Application:
    """Ingress (protocol, CPU) in front of the engine deployment (one engine per replica), and
    of the moderation model's engine deployment when ``args.moderation`` configures one.

    Deployment options (replicas, autoscaling, placement groups, request router) come from
    the Serve config's ``deployments`` section, keyed by deployment name.
    """
    engine = EngineDeployment.bind(args.engine, args.streaming, args.service_tiers)
    if args.moderation is None:
        return ResponsesIngress.bind(engine, args)
    # gpt-oss-safeguard on engine replicas of its own (the same engine contract): its own
    # deployment options in the config's `deployments`, under this name.
    moderation = EngineDeployment.options(name=MODERATION_DEPLOYMENT).bind(
        args.moderation.engine, args.streaming
    )
    return ResponsesIngress.bind(engine, args, moderation)
