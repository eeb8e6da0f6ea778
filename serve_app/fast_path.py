"""Ray's fast path for streaming: the cluster environment in ``configs/fast-path.env``.

HAProxy in front of the ingress replicas (no Python HTTP proxy hop), each ingress replica serving
HTTP and WebSocket itself (direct ingress). The settings live in one file, read here by the
benchmark (loadtests/bench_stream.py), the test stage that reruns the streaming and fault tests
under it (tests/support/fast_path.py, ``SERVE_APP_TEST_FAST_PATH=1``) and k8s/render.py, which sets
them on every Ray container of the RayService; the production configs carry the replicas' part
in their runtime_env (``replica_env``), so ``serve deploy`` onto a cluster started without it
still runs the replicas as measured.
"""

from __future__ import annotations

from pathlib import Path

from dotenv import dotenv_values

FAST_PATH_ENV = Path(__file__).resolve().parent.parent / "configs" / "fast-path.env"

# The variables every Ray process of the cluster must agree on, read by Serve's controller as
# well as by the replicas (Ray 2.60, ray/serve/_private/constants.py, controller.py,
# replica.py): whether HAProxy replaces the proxies and whether ingress replicas serve HTTP
# themselves. They belong in the environment of `ray start` on every node (the RayService's
# containers), never in an application's runtime_env, which reaches its replicas only: a
# replica serving direct ingress that its controller does not route to, or the reverse.
CLUSTER_WIDE = frozenset({"RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_ENABLE_DIRECT_INGRESS"})


def read_env_file(path: Path = FAST_PATH_ENV) -> dict[str, str]:
    """The KEY=VALUE lines of ``path`` (comments and blank lines skipped), in order. A line
    without a value is an error: the file is the cluster's environment, nothing is optional."""
    values = dotenv_values(path, interpolate=False)
    empty = [name for name, value in values.items() if not value]
    if empty:
        raise ValueError(f"{path}: no value for {', '.join(empty)}")
    return {name: value for name, value in values.items() if value}


def replica_env(path: Path = FAST_PATH_ENV) -> dict[str, str]:
    """The variables of ``path`` read in the replicas alone (each replica's event loop for its
    code and its handles' router; the ingress's engine handle over gRPC): the production
    configs' runtime_env carries them (tests/deploy/test_deployment.py checks they agree)."""
    return {name: value for name, value in read_env_file(path).items() if name not in CLUSTER_WIDE}


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
