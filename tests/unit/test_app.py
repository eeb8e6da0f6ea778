"""`build_app`: the moderation model's engine deployment is built when the args configure one
(its own name, so a config's `deployments` size it apart from gpt-oss's), and only then."""

from __future__ import annotations

from serve_app.app import MODERATION_DEPLOYMENT, build_app
from serve_app.config import AppArgs, ModerationArgs


def _deployments(args: AppArgs) -> list[str]:
    # Ray's Application keeps its bound deployment and their arguments privately; no public
    # way lists an unstarted application's deployments.
    ingress = build_app(args)._bound_deployment
    bound = [
        arg._bound_deployment.name for arg in ingress.init_args if hasattr(arg, "_bound_deployment")
    ]
    return [ingress.name, *bound]


def test_the_moderation_deployment_is_built_when_configured() -> None:
    assert _deployments(AppArgs()) == ["ResponsesIngress", "EngineDeployment"]
    moderated = _deployments(AppArgs(moderation=ModerationArgs()))
    assert moderated == ["ResponsesIngress", "EngineDeployment", MODERATION_DEPLOYMENT]
