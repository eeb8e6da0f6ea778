"""The application builder: ``serve run configs/local.yaml`` imports ``build_app`` from here.

No ``from __future__ import annotations`` here: Ray Serve reads the real ``AppArgs`` class from
the signature to validate the config's ``args``.
"""

from ray.serve import Application

from serve_app.config import AppArgs
from serve_app.serving.engine.deployment import EngineDeployment
from serve_app.serving.ingress import ResponsesIngress


def build_app(args: AppArgs) -> Application:
    """Ingress (protocol, CPU) in front of the engine deployment (one engine per replica).

    Deployment options (replicas, autoscaling, placement groups, request router) come from
    the Serve config's ``deployments`` section, keyed by deployment name.
    """
    engine = EngineDeployment.bind(args.engine, args.streaming, args.service_tiers)
    return ResponsesIngress.bind(engine, args)
