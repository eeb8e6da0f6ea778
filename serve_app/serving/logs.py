"""Each replica's own log lines in its Serve log file, each with the id of the request it is
about (docs/reliability.md, "Following one request").

Ray Serve writes a replica's log file (`logs/serve/replica_<app>_<deployment>_<id>.log`) from
its `ray.serve` logger alone, stamping each line with the request id of Serve's request context
(`x-request-id` from the client, or one Serve makes; Serve passes it with every handle call a
request makes, so the engine replica's calls for a turn carry the ingress's id), in text or,
with a deployment's `logging_config: {encoding: JSON}`, as JSON (Ray 2.60,
ray/serve/_private/logging_utils.py). The app logs under `serve_app.*`, which Serve leaves to
the worker's stderr file, without any id. `route_to_replica_log` (each replica's constructor)
hands the app's records to Serve's logger, so they land in the replica's file, formatted as
Serve's own, with the request's id: Serve's where its context names one, else the one this
module's `REQUEST_ID` holds (the response id, set where a request's work starts).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

APP_LOGGER = "serve_app"
SERVE_LOGGER = "ray.serve"
# The attribute Serve's formatters print as the request's id (text: after the replica id).
REQUEST_ID_ATTR = "request_id"
# The request a line is about where Serve's request context names none (a task made in a
# context of its own, or the app run without Serve): the response id. A deployment class uses
# it as `logs.REQUEST_ID`, through the module: Serve ships the class by value, and a ContextVar
# it named directly would have to be pickled, which cannot be.
REQUEST_ID: ContextVar[str | None] = ContextVar("serve_app_request_id", default=None)


def serve_request_id() -> str | None:
    """The request id of Ray Serve's request context here, if any."""
    try:
        from ray.serve.context import _get_serve_request_context
    except ImportError:  # the app without Ray (tests in one process)
        return None
    return _get_serve_request_context().request_id or None


def in_a_replica() -> bool:
    """Whether this process runs a Serve replica (Serve sets its replica context before the
    deployment's constructor runs). Not a driver, nor the tests' process, where importing
    ray.serve alone gives Serve's logger a handler."""
    try:
        from ray.serve.context import _get_internal_replica_context
    except ImportError:
        return False
    return _get_internal_replica_context() is not None


class RequestIdFilter(logging.Filter):
    """Stamps a record with its request's id: Serve's, else `REQUEST_ID`'s (a record that names
    one already keeps it). Filters nothing out."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, REQUEST_ID_ATTR, None):
            found = serve_request_id() or REQUEST_ID.get()
            if found:
                setattr(record, REQUEST_ID_ATTR, found)
        return True


class ToReplicaLog(logging.Handler):
    """Hands each record to Ray Serve's logger, whose handlers write the replica's log file
    (and add Serve's own context: the replica, the route, the application)."""

    def emit(self, record: logging.LogRecord) -> None:
        serve_logger = logging.getLogger(SERVE_LOGGER)
        # At the level Serve's logger has now (a deployment's logging_config.log_level, which
        # a redeploy changes in place).
        if serve_logger.isEnabledFor(record.levelno):
            serve_logger.handle(record)


def route_to_replica_log() -> bool:
    """In a Serve replica: the app's log records go to the replica's log file, each with its
    request's id, at the level of the deployment's `logging_config` (its `log_level`, INFO by
    default); Serve copies its lines to the worker's stderr too, as before. Outside a replica
    (a driver, the tests' process) nothing changes: returns False. Idempotent."""
    serve_logger = logging.getLogger(SERVE_LOGGER)
    app_logger = logging.getLogger(APP_LOGGER)
    if not in_a_replica() or not serve_logger.handlers:
        return False
    if not any(isinstance(handler, ToReplicaLog) for handler in app_logger.handlers):
        handler = ToReplicaLog()
        handler.addFilter(RequestIdFilter())
        app_logger.addHandler(handler)
    app_logger.propagate = False
    # Every record reaches the handler, which applies Serve's level (the app logs nothing at
    # DEBUG on a request's path, so this costs nothing there).
    app_logger.setLevel(logging.DEBUG)
    return True
