"""Optional API keys: bearer tokens checked in constant time, and who owns what is stored.

Keys come from ``$SERVE_APP_API_KEYS`` (comma-separated) and/or the file named by
``$SERVE_APP_API_KEYS_FILE`` (one per line, ``#`` comments), never from the Serve config. With
no keys configured the API is open (a laptop default). Stored responses and conversations
belong to the key that created them (by a digest, never the key itself); another key gets 404.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Header, Request

from serve_app.protocol.errors import APIError

logger = logging.getLogger(__name__)

KEYS_ENV = "SERVE_APP_API_KEYS"
KEYS_FILE_ENV = "SERVE_APP_API_KEYS_FILE"


class Unauthorized(APIError):
    status_code = 401


class ApiKeys:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [key.encode() for key in keys if key]

    @classmethod
    def from_env(cls) -> ApiKeys:
        keys = [key.strip() for key in os.environ.get(KEYS_ENV, "").split(",")]
        keys_file = os.environ.get(KEYS_FILE_ENV)
        if keys_file:
            for line in Path(keys_file).read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    keys.append(line)
        api_keys = cls([key for key in keys if key])
        if not api_keys.enabled:
            logger.warning("no API keys configured: the API is open to anyone who reaches it")
        return api_keys

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def owner(self, authorization: str | None) -> str | None:
        """Who is calling: a digest of their key; None when the API is open. Raises 401."""
        if not self.enabled:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized(
                "You didn't provide an API key. Provide it in an Authorization header using "
                "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            )
        candidate = token.strip().encode()
        # Compare with every key, always: how long this takes says nothing about which matched.
        matches = [hmac.compare_digest(candidate, key) for key in self._keys]
        if not any(matches):
            raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")
        return hashlib.sha256(b"serve_app owner\x00" + candidate).hexdigest()[:32]


def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> str | None:
    """FastAPI dependency: the caller's owner digest, checked against the app's keys."""
    keys: ApiKeys = request.app.state.api_keys
    return keys.owner(authorization)


Owner = Annotated[str | None, Depends(caller)]
