"""serve_app/serving/logs.py: the app's records reach Ray Serve's logger as a replica has it set
up (Serve's own `configure_component_logger`, here in this process, no Ray started), text or
JSON (`logging_config: {encoding: JSON}`), each with its request's id: Serve's request
context's, else the response id the app set. The same across replicas for real:
tests/app/test_request_logs.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.serve._private.logging_utils import configure_component_logger
from ray.serve.context import _RequestContext, _serve_request_context
from ray.serve.schema import LoggingConfig

from serve_app.serving import logs

COMPONENT = "serve_app_EngineDeployment"


@pytest.fixture
def replica_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[callable]:
    """Sets Serve's logger up as in a replica, writing under ``tmp_path``, with the given
    encoding; the app's records routed to it. Both loggers restored after."""
    monkeypatch.setattr(logs, "in_a_replica", lambda: True)
    serve_logger = logging.getLogger(logs.SERVE_LOGGER)
    app_logger = logging.getLogger(logs.APP_LOGGER)
    saved = [
        (logger, list(logger.handlers), logger.propagate, logger.level)
        for logger in (serve_logger, app_logger)
    ]

    def setup(encoding: str) -> Path:
        configure_component_logger(
            component_name=COMPONENT,
            component_id="r1",
            logging_config=LoggingConfig(encoding=encoding, logs_dir=str(tmp_path)),
            max_bytes=1 << 20,
            backup_count=1,
        )
        assert logs.route_to_replica_log()
        return tmp_path

    yield setup
    for logger, handlers, propagate, level in saved:
        for handler in logger.handlers:
            handler.flush()
        logger.handlers[:] = handlers
        logger.propagate, logger.level = propagate, level


def written(folder: Path) -> list[str]:
    logging.getLogger(logs.SERVE_LOGGER).handlers[0].flush()
    return [line for path in folder.glob("*.log") for line in path.read_text().splitlines()]


def test_a_replica_logs_json_with_the_request_id_of_serves_context(replica_log) -> None:
    folder = replica_log("JSON")
    token = _serve_request_context.set(_RequestContext(request_id="trace-1", route="/v1"))
    try:
        logging.getLogger("serve_app.serving.engine.deployment").info(
            "request %s: generated to its end", "resp_1", extra={"response_id": "resp_1"}
        )
    finally:
        _serve_request_context.reset(token)
    (line,) = [json.loads(line) for line in written(folder)]
    assert line["message"] == "request resp_1: generated to its end"
    assert line["request_id"] == "trace-1" and line["response_id"] == "resp_1"
    assert line["levelname"] == "INFO"


def test_without_serves_context_the_line_names_the_response(replica_log) -> None:
    """A task made in a context of its own, or code Serve did not call: the response id the
    app set where the request's work began."""
    folder = replica_log("TEXT")
    token = logs.REQUEST_ID.set("resp_2")
    try:
        logging.getLogger("serve_app.engines.base").warning("request %s failed", "resp_2")
        logs.REQUEST_ID.set(None)
        logging.getLogger("serve_app.serving.retention").info("retention sweep: 0 deleted")
    finally:
        logs.REQUEST_ID.reset(token)
    first, second = written(folder)
    assert COMPONENT in first and " resp_2 " in first and first.endswith("request resp_2 failed")
    assert "retention sweep" in second and "resp_" not in second  # about no request: no id


def test_outside_a_replica_nothing_changes() -> None:
    """A driver or the tests' process (ResponsesIngress's constructor run in one:
    tests/unit/serving/http/test_exposure.py), where importing ray.serve gave Serve's logger a
    handler: the app's records keep their usual way (pytest's capture among them)."""
    assert logging.getLogger(logs.SERVE_LOGGER).handlers  # ray.serve imported: Serve's default
    assert logs.in_a_replica() is False
    assert logs.route_to_replica_log() is False
    assert logging.getLogger(logs.APP_LOGGER).propagate


def test_the_app_logs_at_the_level_of_the_replicas_logging_config(replica_log) -> None:
    folder = replica_log("TEXT")
    logging.getLogger(logs.SERVE_LOGGER).setLevel(logging.WARNING)  # log_level: WARNING
    logging.getLogger("serve_app.x").info("not written")
    logging.getLogger("serve_app.x").warning("written")
    assert [line.rsplit(" -- ", 1)[1] for line in written(folder)] == ["written"]
