"""The rule of access: with API keys configured, a request carries one of them as a bearer
token, or it is a 401 (serve_app.serving.http.auth checks it before the body is read)."""

from __future__ import annotations

from serve_app.protocol.errors import APIError


class Unauthorized(APIError):
    status_code = 401


def check_bearer(scheme: str, token: str) -> None:
    """An ``Authorization: Bearer <token>`` header was sent."""
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "You didn't provide an API key. Provide it in an Authorization header using "
            "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )


def check_key(matched: bool) -> None:
    """The token is one of the keys (compared with each in constant time by the caller)."""
    if not matched:
        raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")
