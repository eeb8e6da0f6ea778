"""Ray's fast path for streaming: the cluster environment in ``configs/fast-path.env``.

HAProxy in front of the ingress replicas (no Python HTTP proxy hop), each ingress replica serving
HTTP and WebSocket itself (direct ingress). The settings live in one file, read here by the
benchmark (loadtests/bench_stream.py), the test stage that reruns the streaming and fault tests
under it (tests/support/fast_path.py, ``SERVE_APP_TEST_FAST_PATH=1``) and k8s/render.py, which sets
them on every Ray container of the RayService.
"""

from __future__ import annotations

from pathlib import Path

from dotenv import dotenv_values

FAST_PATH_ENV = Path(__file__).resolve().parent.parent / "configs" / "fast-path.env"


def read_env_file(path: Path = FAST_PATH_ENV) -> dict[str, str]:
    """The KEY=VALUE lines of ``path`` (comments and blank lines skipped), in order. A line
    without a value is an error: the file is the cluster's environment, nothing is optional."""
    values = dotenv_values(path, interpolate=False)
    empty = [name for name, value in values.items() if not value]
    if empty:
        raise ValueError(f"{path}: no value for {', '.join(empty)}")
    return {name: value for name, value in values.items() if value}


def haproxy_isolation(free_port) -> dict[str, str]:
    """Ports of the cluster's own for what HAProxy mode listens on besides the app's port
    (HAProxy's stats page and Prometheus exporter, Serve's fallback proxy): their defaults are
    fixed, so two such clusters on one machine (a benchmark and a test run) would collide.
    ``free_port()`` returns a free TCP port."""
    return {
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(free_port()),
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(free_port()),
    }
