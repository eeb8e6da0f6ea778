"""The store soak's fault schedule (loadtests/soak_store.py). The soak itself against the app:
tests/app/test_loadtests.py."""

from __future__ import annotations

import sys

from tests.support.helpers import REPO

sys.path.insert(0, str(REPO / "loadtests"))
import soak_store


def test_the_fault_soak_kills_engines_every_period_and_an_ingress_once() -> None:
    assert soak_store.kill_schedule(600, 120) == [
        (120, "EngineDeployment"),
        (240, "EngineDeployment"),
        (300, "ResponsesIngress"),
        (360, "EngineDeployment"),
        (480, "EngineDeployment"),
    ]
    short = soak_store.kill_schedule(120, 120)
    assert [name for _, name in short].count("ResponsesIngress") == 1
    assert [name for _, name in short].count("EngineDeployment") == 2
