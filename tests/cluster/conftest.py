"""The cluster stage: one Ray cluster of several nodes for every test in this folder.

``ray.cluster_utils.Cluster``, Ray's own multi-node harness on one machine
(tests/support/cluster.py): a head (Serve's controller and proxy, the two ingress replicas) and a
worker node standing for a GPU node (engine replicas only, by a custom resource), the app
deployed from its Serve config as ``serve deploy`` deploys it, its store on a throwaway
PostgreSQL server. Started once for the session (a few seconds a node, the app about half a
minute on this machine), and the tests run in this order, each leaving the cluster as the next
expects it:

1. test_autoscale.py: the engine autoscaled 1 -> 3 -> 1 on the worker node under the replay;
2. test_upgrade.py: a new version of the config rolled out under the replay, with the engine's
   replicas on one node, then (a second worker node joined) across two;
3. test_node_loss.py (marked ``faults``, so last): a worker node lost under the replay.

Run alone: ``python -m pytest tests/cluster`` (tests/conftest.py deselects these beside any
other test: this process joins the cluster as a driver, and a process joins one cluster). With
``SERVE_APP_TEST_FAST_PATH=1`` every node gets configs/fast-path.env, as the RayService gives
every Ray container (HAProxy in front, direct ingress, the engine calls over gRPC).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.support import REPO, serve_run
from tests.support.cluster import ClusterApp, cluster_app
from tests.support.fast_path import fast_path_env

sys.path.insert(0, str(REPO / "loadtests"))
from scaling import AUTOSCALING


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterApp]:
    """The cluster, a head and one worker node, the app RUNNING on it, its engine autoscaled
    (loadtests/scaling.py's ``AUTOSCALING``: at its minimum, one replica, until loaded)."""
    engine = {"autoscaling_config": AUTOSCALING}
    with cluster_app(workers=1, engine=engine, env=fast_path_env(serve_run.free_port)) as app:
        yield app
