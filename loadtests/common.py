"""Helpers the benchmarks share (run as scripts, they import this from their own folder)."""

from __future__ import annotations

import socket
from collections.abc import Sequence

MODEL = "gpt-oss-120b"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]
