"""The vLLM stage joins the app's own Ray cluster by its address.

``address="auto"`` is the newest cluster on the machine: on a machine where other Ray clusters
start while the (slow) vLLM app comes up, the session's ``app_cluster`` would refuse to run.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import _gcs_address


@pytest.fixture(scope="session")
def app_cluster(app_url: str, _serve_run: subprocess.Popen) -> Iterator[None]:
    """This test process joined to the app's Ray cluster, to look inside or break replicas."""
    import ray
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    # `serve run` started its cluster with token authentication (Ray's default for a new local
    # cluster, the token in ~/.ray/auth_token). ray.init turns it on for address="auto" only,
    # with this function (no public API does it for an address given).
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    ray.init(address=_gcs_address(_serve_run.pid), logging_level="ERROR")
    yield
    ray.shutdown()
