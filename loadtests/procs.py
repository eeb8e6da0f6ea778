"""The processes a benchmark measures, from /proc: who they are (parent, title, role) and the
CPU time they spent."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def read_text(path: str) -> str:
    """A /proc file's text; empty when it cannot be read (the process is gone)."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def process_table() -> dict[int, tuple[int, str]]:
    """Every process: its parent and its title (command line, as Ray and vLLM set it)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = read_text(f"/proc/{entry}/stat")
        if not stat:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        title = read_text(f"/proc/{entry}/cmdline").replace("\0", " ").strip()
        table[int(entry)] = (parent, title)
    return table


def descendants(root: int, table: Mapping[int, tuple[int, str]]) -> list[int]:
    """``root`` and every process under it, ``root`` first."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, pending = [root], list(children.get(root, []))
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def role_of(title: str, roles: Sequence[tuple[str, str]], default: str) -> str:
    """The role of the first marker found in ``title``, else ``default``."""
    return next((role for marker, role in roles if marker in title), default)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far, its threads included, its children not; NaN
    when it is gone."""
    stat = read_text(f"/proc/{pid}/stat")
    if not stat:
        return float("nan")
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
