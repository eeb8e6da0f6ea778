"""Optional API keys: bearer tokens checked in constant time, and who owns what is stored.

Keys come from ``$SERVE_APP_API_KEYS`` (comma-separated) and/or the file named by
``$SERVE_APP_API_KEYS_FILE`` (one per line, ``#`` comments): the overrides of the app's
`SecretArgs` fields, which a Serve config should leave unset (keys are secrets). With
no keys configured the API is open: on loopback only, unless the operator allows it
(serve_app/serving/http/exposure.py: closed by default). Stored responses and conversations
belong to the key that created them (by a digest, never the key itself); another key gets 404.

A key's digest (`owner_digest`) is also how a config names it (`service_tiers.keys`): print a
key's with ``python -m serve_app.serving.http.auth`` (keys on standard input, one a line).

The key is checked before anything else of an HTTP request (`RequireKey`, pure ASGI): a missing
or wrong key is a 401 whatever the body, and a request without a valid key never has its body
read (an unauthenticated client cannot hold a request slot by trickling a body in).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import sys
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.config import SecretArgs
from serve_app.serving import metrics
from serve_app.serving.admission import access
from serve_app.serving.admission.access import Unauthorized

logger = logging.getLogger(__name__)

# Paths any client may reach without a key: probes, metrics, the API's own description.
PUBLIC_PATHS = frozenset({"/health", "/ready", "/metrics", "/openapi.json", "/docs", "/redoc"})
# Where `RequireKey` leaves the caller's owner digest, in the request's scope state.
_OWNER = "serve_app.owner"


class ApiKeys:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [key.encode() for key in keys if key]

    @classmethod
    def from_env(cls, secrets: SecretArgs | None = None) -> ApiKeys:
        """The keys of ``secrets`` (the app's; none by default) and of its keys file, with the
        environment's overrides (`SecretArgs.resolved`)."""
        secrets = (secrets or SecretArgs()).resolved()
        keys = list(secrets.api_keys)
        if secrets.api_keys_file:
            for line in Path(secrets.api_keys_file).read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    keys.append(line)
        # Without keys the API is open: whether it may be is decided (and logged) by
        # serve_app/serving/http/exposure.py.
        return cls([key for key in keys if key])

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def owner(self, authorization: str | None) -> str | None:
        """Who is calling: a digest of their key; None when the API is open. Raises 401."""
        if not self.enabled:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        access.check_bearer(scheme, token)
        candidate = token.strip().encode()
        # Compare with every key, always: how long this takes says nothing about which matched.
        matches = [hmac.compare_digest(candidate, key) for key in self._keys]
        access.check_key(any(matches))
        return _digest(candidate)


def owner_digest(key: str) -> str:
    """The owner digest of ``key``: what the store keeps its responses under and a config
    names it by (`serve_app.config.ServiceTierArgs.keys`), never the key."""
    return _digest(key.strip().encode())


def _digest(key: bytes) -> str:
    return hashlib.sha256(b"serve_app owner\x00" + key).hexdigest()[:32]


class RequireKey:
    """Pure ASGI: every HTTP request outside `PUBLIC_PATHS` needs a valid key, checked from
    its headers alone, before any other middleware or FastAPI reads or validates its body.

    WebSocket upgrades are checked by their route (`websocket.py`), which answers a refused
    key with an error event: they carry no body to read first.
    """

    def __init__(self, app: ASGIApp, api_keys: ApiKeys) -> None:
        self.app = app
        self.api_keys = api_keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _route_path(scope) in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        try:
            owner = self.api_keys.owner(Headers(scope=scope).get("authorization"))
        except Unauthorized as refused:
            metrics.REQUESTS.labels("rejected").inc()
            logger.info("rejected: %s (code %s)", refused.message, refused.code)
            # The body is left unread: close the connection rather than wait for it.
            response = JSONResponse(
                refused.body(), status_code=refused.status_code, headers={"connection": "close"}
            )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})[_OWNER] = owner
        await self.app(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path within the app (without the prefix Serve or a proxy mounts it under)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


async def caller(request: Request) -> str | None:
    """FastAPI dependency: the caller's owner digest, as `RequireKey` checked it. Async: FastAPI
    runs a plain function dependency on a worker thread, a thread hop on every request."""
    return request.scope["state"][_OWNER]


Owner = Annotated[str | None, Depends(caller)]


if __name__ == "__main__":
    # Keys on standard input, not as arguments: arguments stay in the shell's history.
    for line in sys.stdin:
        if line.strip():
            print(owner_digest(line))
