"""Readiness: whether this ingress replica can serve a turn now, for ``GET /ready``.

``/health`` is liveness: this replica's event loop answers (a restart would mend nothing else).
``/ready`` also asks what a turn needs beyond the replica, each once, concurrently, within a
short timeout: the response store (one ``SELECT 1``) and an engine replica (its ``check_health``
through the engine handle, routed like a request without a conversation). Each that fails or
does not answer in time is named in a 503 in OpenAI's error shape, so a load balancer or a
monitor takes the service out or pages, and the operator reads which part failed.

An engine that turns the check away because every engine replica and its queue are full
(back-pressure) is busy, not broken: ready.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from serve_app.protocol.errors import error_body
from serve_app.serving.engine.client import EngineClient
from serve_app.store.base import ResponseStore

logger = logging.getLogger(__name__)

# Long enough for a busy store or engine replica to answer one trivial call; short enough for a
# probe (Kubernetes' default probe timeout is 1 s: set the probe's timeoutSeconds above this).
CHECK_TIMEOUT_S = 5.0
NOT_READY_CODE = "service_unavailable"


class Readiness:
    def __init__(
        self, store: ResponseStore, engine: EngineClient, timeout_s: float = CHECK_TIMEOUT_S
    ) -> None:
        # Looked up when asked, not now: the app can be built on a client without checks.
        self._checks: dict[str, Callable[[], Awaitable[None]]] = {
            "store": lambda: store.ping(),
            "engine": lambda: engine.ping(),
        }
        self._timeout_s = timeout_s

    async def failures(self) -> dict[str, str]:
        """What failed, by check ("store", "engine"), and why; empty when ready."""
        names = list(self._checks)
        outcomes = await asyncio.gather(*(self._check(self._checks[name]) for name in names))
        return {name: why for name, why in zip(names, outcomes, strict=True) if why is not None}

    async def _check(self, check: Callable[[], Awaitable[None]]) -> str | None:
        try:
            await asyncio.wait_for(check(), self._timeout_s)
        except TimeoutError:
            return f"no answer within {self._timeout_s:g}s"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:300]
        return None


def not_ready_body(failures: dict[str, str]) -> dict:
    """The 503's body: OpenAI's error shape, naming each check that failed."""
    named = "; ".join(f"{name}: {why}" for name, why in failures.items())
    logger.warning("not ready: %s", named)
    return error_body(f"The service is not ready ({named}).", "server_error", code=NOT_READY_CODE)
