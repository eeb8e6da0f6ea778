"""The app under Ray's fast path (configs/fast-path.env: HAProxy in front, direct ingress to the
ingress replicas), for the fast-path stage of scripts/test.sh (``SERVE_APP_TEST_FAST_PATH=1``),
which reruns the serve tier's stream, WebSocket, disconnect, overload and fault tests so."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from serve_app.fast_path import haproxy_isolation, read_env_file


def fast_path_env(free_port: Callable[[], int]) -> dict[str, str]:
    """The environment `serve run` gets on top of the test process's: configs/fast-path.env
    and ports of its own for HAProxy's side listeners, with ``SERVE_APP_TEST_FAST_PATH=1`` (or
    another env file, with its path there); nothing otherwise. Only `serve run` gets it: the
    test process joins the cluster with Ray's defaults (its handles are a driver's, not a
    replica's)."""
    chosen = os.environ.get("SERVE_APP_TEST_FAST_PATH")
    if not chosen:
        return {}
    # "1": configs/fast-path.env; else the path of another such file (a variant to try).
    env = read_env_file() if chosen == "1" else read_env_file(Path(chosen))
    return {**env, **haproxy_isolation(free_port)}
