"""A pytest plugin for scripts/record_traffic.py: tells the recording app which test runs.

Loaded with ``-p tests.support.traffic_plugin`` and ``$SERVE_APP_TRAFFIC_RECORDER`` (the
recording app's URL): at each test's set-up, before its fixtures, ``/_traffic/begin`` names
the test and the distributions its module imports; when the test is over, ``/_traffic/end``
says whether it passed. Every request the app gets in between is that test's.
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

import pytest

from tests.support.traffic_recorder import CONTROL, imported_distributions

RECORDER_ENV = "SERVE_APP_TRAFFIC_RECORDER"
_OUTCOMES: dict[str, list[str]] = {}


def _notify(what: str, notice: dict[str, Any]) -> None:
    request = urllib.request.Request(
        os.environ[RECORDER_ENV].rstrip("/") + CONTROL + what,
        data=json.dumps(notice).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _OUTCOMES[item.nodeid] = []
    _notify("begin", {"test": item.nodeid, "imports": imported_distributions(item.path)})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _OUTCOMES.setdefault(report.nodeid, []).append(report.outcome)


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    outcomes = _OUTCOMES.pop(nodeid, [])
    passed = bool(outcomes) and all(outcome == "passed" for outcome in outcomes)
    _notify("end", {"test": nodeid, "passed": passed})
