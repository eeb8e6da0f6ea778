"""The processes a benchmark measures, from /proc: who they are (parent, title, role) and the
CPU time they spent."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A line of ``perf report --stdio -q``: a share, then the key it was sorted by.
PERF_LINE = re.compile(r"^\s*([\d.]+)%\s+(.+?)\s*$")


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


def perf_record(seconds: int, data: Path, log: Path) -> subprocess.Popen:
    """``perf record`` of the whole machine for ``seconds``, sampled on CPU time (the
    ``cpu-clock`` software event: no hardware counters in a VM), native frames only: which
    library and which thread each process spends its CPU in, C++ and kernel included, which
    py-spy cannot unwind in Ray's workers. The whole machine, because this kernel counts
    nothing for a recording attached to one running process (``-p``: "not counted"); each
    process is read apart (:func:`perf_shares`). Its output goes to ``log``."""
    perf = shutil.which("perf")
    if perf is None:
        raise RuntimeError("perf is not installed (Debian: apt-get install linux-perf)")
    command = [perf, "record", "-a", "-e", "cpu-clock", "-F", "997", "-o", str(data)]
    with log.open("w") as out:
        return subprocess.Popen(
            [*command, "--", "sleep", str(seconds)], stdout=out, stderr=subprocess.STDOUT
        )


def perf_shares(data: Path, pid: int, sort: str) -> dict[str, float]:
    """Process ``pid``'s samples in the recording by ``sort`` (``dso``: the library; ``comm``:
    the thread's name; ``dso,sym``: the function), each key's share of its samples, largest
    first."""
    report = ["perf", "report", "-i", str(data), "--pid", str(pid), "--stdio", "-q"]
    done = subprocess.run(
        [*report, "--no-children", "--sort", sort],
        capture_output=True,
        text=True,
        check=False,
    )
    shares: dict[str, float] = {}
    for line in done.stdout.splitlines():
        if match := PERF_LINE.match(line):
            key = " ".join(match[2].split())  # perf pads its columns
            shares[key] = shares.get(key, 0.0) + float(match[1]) / 100
    total = sum(shares.values())  # --pid's percentages are of every process's samples
    return {key: share / total for key, share in sorted(shares.items(), key=lambda i: -i[1])}
