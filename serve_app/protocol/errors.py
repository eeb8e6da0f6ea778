"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

RATE_LIMITED = "rate_limit_exceeded"
RETRY_AFTER_S = 1  # how long a client turned away at capacity waits before its retry


class APIError(Exception):
    """An error answered to the client as JSON in OpenAI's shape, with an HTTP status."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status_code: int | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        if status_code is not None:
            self.status_code = status_code
        if error_type is not None:
            self.error_type = error_type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)


class InvalidRequest(APIError):
    """400: the request is malformed or inconsistent."""


class NotFound(APIError):
    status_code = 404


class RateLimited(APIError):
    """429: every engine is busy. ``Retry-After`` says when to try again; Codex reads the delay
    from the message instead, so the message names it too."""

    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str | None = None, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(
            message or f"The engines are at capacity. Please try again in {retry_after_s}s.",
            code=RATE_LIMITED,
            headers={"Retry-After": str(retry_after_s)},
        )


class ServerError(APIError):
    """500: the server (an engine, a replica) failed; the request may succeed if sent again."""

    status_code = 500
    error_type = "server_error"


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def model_not_found(model: str) -> NotFound:
    return NotFound(
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def param_path(loc: tuple[int | str, ...]) -> str:
    """Turn a pydantic error location into OpenAI's param notation: ``input[3].call_id``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path
