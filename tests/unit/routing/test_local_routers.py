"""The process's registry of request routers (serve_app.routing.local_routers): loads pushed
to every router, from the serving code's thread."""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from serve_app.routing import local_routers


class _Router:
    report_wait_s = 0.0
    wants_loads = True

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.loads: list[tuple[str, Mapping[str, Any]]] = []

    def placement_reported(self, key: str) -> bool:
        return True

    def push_load(self, replica: str, load: Mapping[str, Any]) -> None:
        if self.fails:
            raise RuntimeError("a broken router")
        self.loads.append((replica, load))


def test_a_router_that_fails_to_take_a_load_keeps_it_from_no_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A push is advice: the channel reader that hands it on must not fail (its requests
    would), nor the other routers miss it."""
    routers = [_Router(fails=True), _Router(), _Router(fails=True)]
    for router in routers:
        local_routers.register(router)
    local_routers.push_load("engine-1", {"queued_prefill_tokens": 5})
    assert routers[1].loads == [("engine-1", {"queued_prefill_tokens": 5})]
    assert "could not take engine replica engine-1's load" in caplog.text


def test_routers_registering_while_loads_are_pushed_from_another_thread() -> None:
    """Routers register on their loops' threads as the serving code's loop pushes: the pusher
    never meets the registry changing under it (with threads switching as often as Python
    lets them)."""
    stop = threading.Event()
    errors: list[BaseException] = []
    pushes = 0

    def push() -> None:
        nonlocal pushes
        try:
            while not stop.is_set():
                local_routers.push_load("engine-1", {"queued_prefill_tokens": 1})
                pushes += 1
        except BaseException as exc:  # what the channel reader would have died of
            errors.append(exc)

    kept: list[_Router] = []
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    pusher = threading.Thread(target=push)
    try:
        pusher.start()
        for _ in range(20_000):
            router = _Router()
            kept.append(router)
            local_routers.register(router)
            if len(kept) > 200:
                kept.pop(0)  # dropped: the weak set forgets it as the pusher reads it
    finally:
        stop.set()
        pusher.join()
        sys.setswitchinterval(switching)
    assert not errors, errors
    assert pushes > 0
