"""One response store for every ingress replica: an SQLite file is node-local, so on a Ray
cluster of several nodes the ingress replicas (autoscaled, or restarted elsewhere) would each
open a file of their own, and `previous_response_id`, stored responses and conversations would
miss at random. Such a replica refuses to start, saying what to set instead."""

from __future__ import annotations

import ray
from sqlalchemy.engine import make_url


class StoreNotShared(RuntimeError):
    """A node-local store on a cluster whose ingress replicas can run on several nodes."""


def is_node_local(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def printable(url: str) -> str:
    """The URL for a log line: its password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def require_shared_store(url: str, nodes: int) -> None:
    """Raise `StoreNotShared` when ``url`` is node-local and the cluster has ``nodes`` > 1."""
    if nodes > 1 and is_node_local(url):
        raise StoreNotShared(
            f"The response store {printable(url)} is an SQLite file on one node, and this Ray "
            f"cluster has {nodes} nodes: ingress replicas on the others would each use a file "
            "of their own, and previous_response_id and conversations would miss. Set "
            "SERVE_APP_STORE_URL (or store.url in the app's args) to a PostgreSQL server "
            "reachable from every node: postgresql+asyncpg://user:password@host/db "
            "(k8s/postgres.yaml; `pip install '.[postgres]'`)."
        )


def alive_nodes() -> int:
    """Nodes of the Ray cluster this process is connected to."""
    return sum(1 for node in ray.nodes() if node["Alive"])
