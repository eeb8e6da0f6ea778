"""LOAD_SHAPE of loadtests/locustfile.py: users by stage, ``"end_s:users,..."``.

``"20:4,60:12,100:4"``: 4 users until 20 s, then 12 until 60 s, then 4 until 100 s, then the end.
Apart from the locustfile so that it can be read without importing locust (which patches the
standard library with gevent as it is imported).
"""

from __future__ import annotations


def parse_shape(text: str) -> list[tuple[float, int]]:
    """The stages: ``"20:4,60:12"`` is [(20.0, 4), (60.0, 12)], each (end, users)."""
    stages = []
    for stage in text.split(","):
        end, users = stage.split(":")
        stages.append((float(end), int(users)))
    ends = [end for end, _ in stages]
    if ends != sorted(ends) or len(set(ends)) != len(ends):
        raise ValueError(f"LOAD_SHAPE's stages must end in order: {text}")
    return stages


def users_at(stages: list[tuple[float, int]], run_time: float) -> int | None:
    """How many users the stages want at ``run_time``; None once the last has ended."""
    for end, users in stages:
        if run_time < end:
            return users
    return None


def changes(stages: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """When the load changes, and to how many users (0 at the end)."""
    starts = [0.0, *(end for end, _ in stages)]
    users = [count for _, count in stages] + [0]
    return list(zip(starts, users, strict=True))


def end_of(stages: list[tuple[float, int]]) -> float:
    return stages[-1][0]
