"""Closed by default: an app reachable beyond this machine refuses to start without API keys.

Without keys anyone who reaches the app uses its GPUs and, with an id, reads or deletes any
stored response. That is fine for `serve run configs/local.yaml` on a laptop (Serve listening on
loopback only), and not for an app listening on every interface (``http_options.host: 0.0.0.0``,
as configs/gpt-oss.yaml and the RayService do) or spread over a Ray cluster of several nodes.
So each ingress replica, as it starts, decides (`api_access`): keys set, the API is closed;
no keys and reachable only through loopback, it is open (a warning); no keys and reachable
beyond, it refuses to start (`OpenApiRefused`, naming what to set), unless the operator opted
out with ``allow_open_api: true`` in the app's args: then it serves open, says so in its log
(a warning) and on ``/health`` (``"api": "open"``).

Where Serve listens: the ``http_options.host`` the Serve controller holds. Serve's HTTP proxy,
HAProxy and the direct-ingress servers of the ingress replicas (Ray's fast path,
configs/fast-path.env) all bind that host (HAProxy mode changes only its default, to every
interface), so one value covers every front.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Literal

from serve_app.config import API_KEYS_ENV, API_KEYS_FILE_ENV

logger = logging.getLogger(__name__)

ApiAccess = Literal["closed", "open"]


class OpenApiRefused(RuntimeError):
    """No API keys on an app reachable beyond this machine, and no explicit opt-out."""


def is_loopback(host: str | None) -> bool:
    """Whether a server bound to ``host`` is reachable from this machine only. ``None`` (Serve's
    unset host) and names other than ``localhost`` count as reachable: when unsure, closed."""
    if host is None:
        return False
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Exposure:
    """Where the app can be reached from: the host Serve listens on (``None`` when it could not
    be learned) and the nodes of its Ray cluster."""

    host: str | None
    nodes: int

    def beyond_loopback(self) -> list[str]:
        """Why the app is reachable beyond this machine; empty when it is not."""
        reasons = []
        if not is_loopback(self.host):
            where = repr(self.host) if self.host is not None else "a host it could not learn"
            reasons.append(f"Serve listens on {where} (http_options.host), beyond loopback")
        if self.nodes > 1:
            reasons.append(f"the Ray cluster has {self.nodes} nodes")
        return reasons


def api_access(has_keys: bool, exposure: Exposure, allow_open_api: bool) -> ApiAccess:
    """ "closed" with keys; "open" without them on loopback or when the operator allowed it
    (logged as a warning); `OpenApiRefused` otherwise."""
    if has_keys:
        return "closed"
    reasons = exposure.beyond_loopback()
    if not reasons:
        logger.warning("no API keys configured: the API is open (Serve listens on loopback only)")
        return "open"
    why = "; ".join(reasons)
    if allow_open_api:
        logger.warning(
            "no API keys configured and allow_open_api is true: the API is OPEN to anyone who "
            "reaches it (%s): they use the GPUs and read or delete stored responses by id",
            why,
        )
        return "open"
    raise OpenApiRefused(
        f"No API keys are configured and the app is reachable beyond this machine ({why}): "
        "anyone reaching it would use the model and read or delete stored responses. Set "
        f"{API_KEYS_ENV} (comma-separated keys) or {API_KEYS_FILE_ENV} (a file of keys, one a "
        "line), or secrets.api_keys / secrets.api_keys_file in the app's args; or, to serve "
        "it open on purpose, set allow_open_api: true in the app's args."
    )


async def serve_http_host() -> str | None:
    """The ``http_options.host`` of this Serve instance, from its controller; None when it
    cannot be asked. Ray 2.60 has no public API for it (``serve.status()`` omits HTTP options):
    this asks the controller actor what Serve's own replicas ask before starting their
    direct-ingress servers (``get_http_config``)."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        options = await controller.get_http_config.remote()
    except Exception:  # no controller, or a Ray without that method: unknown, so not loopback
        logger.exception("could not learn the host Serve listens on")
        return None
    return options.host
