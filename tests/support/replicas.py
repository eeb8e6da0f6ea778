"""The running app's replicas, seen through Ray (for tests joined by ``app_cluster``).

Tests ask the replicas which of them serves a conversation rather than predicting it with a
handle of their own: a router in the test process has neither the ingress routers' queue-length
view nor their recent placements, so it may place a new conversation elsewhere than they do.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any

import httpx
import ray

from serve_app.routing.directory import REPORT_KEY
from serve_app.routing.keys import routing_key
from serve_app.routing.ring import stable_hash
from serve_app.serving.http.auth import ApiKeys
from tests.support import API_KEY, AUTH, OTHER_API_KEY

CALL_TIMEOUT_S = 30
# The API keys the session's app may be closed with (tests/conftest.py), and any the
# environment gives it.
TEST_API_KEYS = (API_KEY, OTHER_API_KEY)


def owner_of(api_key: str) -> str | None:
    """The owner digest the app gives a caller with ``api_key`` (serving/http/auth.py)."""
    return ApiKeys([api_key]).owner(f"Bearer {api_key}")


def caller_owner(app_url: str, api_key: str) -> str | None:
    """The owner the running app gives a caller with ``api_key``: None if the app is open (it
    answers a request without a key), where every caller is one tenant."""
    if httpx.get(f"{app_url}/v1/models", timeout=30).status_code == 200:
        return None
    return owner_of(api_key)


def conversation_hashes(prompt_cache_key: str) -> set[int]:
    """What the engine replicas may report the conversation ``prompt_cache_key`` as: the key
    itself on an open app, or scoped by the owner of one of the app's keys on a closed one
    (routing keys are per owner: serve_app/routing/keys.py)."""
    configured = os.environ.get("SERVE_APP_API_KEYS", "").split(",")
    api_keys = {key.strip() for key in (*TEST_API_KEYS, *configured) if key.strip()}
    owners = [None, *(owner_of(key) for key in sorted(api_keys))]
    return {stable_hash(routing_key(prompt_cache_key, (), owner=owner)) for owner in owners}


def reported_for(report: Mapping[int, Any], prompt_cache_key: str, default: Any = None) -> Any:
    """The entry of a per-conversation report (conversations, held tokens) for the
    conversation ``prompt_cache_key``, under whichever owner sent it."""
    found = conversation_hashes(prompt_cache_key) & report.keys()
    return report[found.pop()] if found else default


def replica_actors(deployment: str) -> list[dict]:
    """A deployment's replica actors alive now: ``name`` and ``namespace`` each."""
    return [
        actor
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if deployment in actor["name"]
    ]


def engine_replica_actors() -> list[dict]:
    return replica_actors("EngineDeployment")


def replica_actor(actor: dict) -> ray.actor.ActorHandle:
    return ray.get_actor(actor["name"], namespace=actor["namespace"])


def engine_replica_serving(key: str) -> dict | None:
    """The engine replica that reports serving the conversation ``key`` (its routing stats,
    as the Serve controller collects them), or None if none does."""
    serving = [
        actor
        for actor in engine_replica_actors()
        if reported_for(routing_stats(actor).get(REPORT_KEY, {}), key) is not None
    ]
    assert len(serving) <= 1, f"{len(serving)} engine replicas report serving {key}"
    return serving[0] if serving else None


def engine_ongoing(key: str) -> int:
    """Requests running in the engine of the replica serving ``key`` (0 if none serves it)."""
    actor = engine_replica_serving(key)
    return 0 if actor is None else call_deployment(actor, "num_ongoing_requests")


def call_deployment(actor: dict, method: str) -> Any:
    """Call a (synchronous) method of the deployment instance a replica runs, on that replica:
    no request router in between. Ray's ``__ray_call__`` runs the function in the actor."""
    call = replica_actor(actor).__ray_call__.remote(_call_servable_object, method)
    return ray.get(call, timeout=CALL_TIMEOUT_S)


def _call_servable_object(_replica_actor: object, method: str) -> Any:
    from ray import serve  # imported where it runs: in the replica's process

    return getattr(serve.get_replica_context().servable_object, method)()


def replica_started(actor: dict) -> bool:
    """Whether a replica has run its constructor (a replacement is listed before it has, and
    its methods fail until then)."""
    try:
        call_deployment(actor, "replica_id")
    except ray.exceptions.RayError:
        return False
    return True


def routing_stats(actor: dict) -> dict:
    """As the Serve controller collects them, with the replica actor's own method."""
    return ray.get(replica_actor(actor).record_routing_stats.remote(), timeout=CALL_TIMEOUT_S)


def wait_for_ingress_replicas(app_url: str, count: int, timeout_s: float = 120) -> None:
    """Leave the app as found after a fault: ``count`` ingress replicas back and answering
    (each names itself in ``x-serve-app-replica``; one still starting may refuse or fail)."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < count:
        assert time.monotonic() < deadline, f"only {len(seen)} ingress replicas came back"
        with contextlib.suppress(httpx.HTTPError):
            answer = httpx.get(f"{app_url}/v1/models", headers=AUTH, timeout=10)
            if answer.status_code == 200:
                seen.add(answer.headers["x-serve-app-replica"])
        time.sleep(0.2)
