"""``service_tier`` (issue 49): what a request may ask, and the tier it is served at.

The openai SDK types seven values (``ServiceTier``); this deployment schedules three tiers
(`serve_app.config.ServedTier`), and the Response reports the one a request was served at, as
OpenAI reports "the processing mode actually used" (so ``fast`` is answered ``priority``, as
OpenAI answers it). The engines order waiting requests by the tier's deadline
(`serve_app.config.ServiceTierArgs`); `PRIORITY` is the tier's rank, vLLM's convention (lower
first, 0 the default), which labels engine requests by tier for the metrics, the router and the
autoscaling policy. No harmony, no Ray.
"""

from __future__ import annotations

from typing import Literal, get_args

from serve_app.config import SERVED_TIERS, ServedTier, TierPolicy

# Every value the openai SDK types (`openai.types.responses.ServiceTier`, 3.57;
# tests/unit/protocol/test_service_tiers.py fails when the SDK adds one).
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]
SERVICE_TIERS: tuple[str, ...] = get_args(ServiceTier)

# What each value but ``auto`` is served at. ``fast`` is OpenAI's other name for priority.
# ``ultrafast`` is OpenAI's access-controlled faster path for one model: this deployment has
# none faster than its priority tier, so it is served (and reported) as priority; who may use
# priority is the operator's policy. ``scale`` asks for reserved capacity units, which this
# deployment does not sell: served as default, as OpenAI serves a project without them.
SERVED_AS: dict[str, ServedTier] = {
    "default": "default",
    "flex": "flex",
    "scale": "default",
    "priority": "priority",
    "fast": "priority",
    "ultrafast": "priority",
}

# Each tier's rank, lower first (vLLM's `priority` convention; 0 is what an engine request that
# names no tier has: default's).
PRIORITY: dict[ServedTier, int] = {"priority": -1, "default": 0, "flex": 1}
_TIER_OF: dict[int, ServedTier] = {rank: tier for tier, rank in PRIORITY.items()}


def served_tier(requested: str | None, policy: TierPolicy) -> ServedTier:
    """The tier a request asking ``requested`` is served at under ``policy`` (its key's):
    ``auto`` and no value are the policy's ``auto``. Whether the key may use it is the door's
    rule (serve_app/serving/admission/responses.py)."""
    if requested is None or requested == "auto":
        return policy.auto
    return SERVED_AS[requested]


def tier_of(priority: int) -> ServedTier | None:
    """The tier of an engine request's rank (None: a rank no tier has)."""
    return _TIER_OF.get(priority)


__all__ = [
    "PRIORITY",
    "SERVED_AS",
    "SERVED_TIERS",
    "SERVICE_TIERS",
    "ServiceTier",
    "served_tier",
    "tier_of",
]
