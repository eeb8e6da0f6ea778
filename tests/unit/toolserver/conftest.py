"""One reference tool server per test session on a small document folder (its python runs
sandboxed, the default), and a python-only one told to run unsandboxed whose network
isolation is the audit hook (the fallback where no namespace can be made)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.toolserver import ToolServer, tool_server

# Tight limits, so a test of each returns fast; eight at once, so the concurrency test runs them
# all together.
PYTHON_LIMITS = (
    "--python-cpu-seconds", "1",
    "--python-wall-seconds", "10",
    "--python-memory-mb", "256",
    "--python-output-bytes", "4096",
    "--python-concurrency", "8",
)  # fmt: skip

ZEBRA = "# Zebras\n\nZebras have black and white stripes.\n"
AUTOSCALING = """# Ray Serve autoscaling

Ray Serve scales a deployment between `min_replicas` and `max_replicas`.
The autoscaler keeps about target_ongoing_requests per replica.

How requests find a replica: [the routing page](routing.html).
"""
ROUTING = """<html><head><title>Prefix-affinity routing</title>
<script>var SECRET_SCRIPT_TEXT = 1;</script></head><body>
<h1>Routing</h1>
<p>The router sends a conversation to the replica that holds its KV cache.</p>
<script>document.write("SECRET_SCRIPT_TEXT")</script><style>p { color: red }</style>
<ul><li>Consistent hashing with bounded load</li>
<li>See <a href="ray-serve.md">autoscaling</a> and <a href="https://example.com/ring">rings</a></li></ul>
</body></html>
"""


def long_text() -> str:
    lines = [f"Line {i} of the harmony notes: channels, recipients and tokens." for i in range(300)]
    lines[150] = "The special word needle-7391 is on this line."
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    (root / "notes").mkdir()
    (root / "notes" / "zebra.md").write_text(ZEBRA)
    (root / "ray-serve.md").write_text(AUTOSCALING)
    (root / "routing.html").write_text(ROUTING)
    (root / "harmony.txt").write_text(long_text())
    (root / ".hidden.md").write_text("# Hidden\n\nhiddenterm\n")
    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_text("outsideterm\n")
    os.symlink(outside, root / "linked.txt")
    return root


@pytest.fixture(scope="session")
def server(docs: Path) -> Iterator[ToolServer]:
    with tool_server(docs, *PYTHON_LIMITS) as running:
        yield running


@pytest.fixture(scope="session")
def hook_server() -> Iterator[ToolServer]:
    with tool_server(
        None, *PYTHON_LIMITS, "--python-sandbox", "none", "--python-network", "hook"
    ) as running:
        yield running
