"""The processes a benchmark measures, from /proc: who they are (parent, title, role) and the
CPU time they spent."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A line of ``perf script -F comm,pid,ip,sym,dso``: the thread's name, the process, the
# address, the function (``[unknown]`` where the library has no symbols), the library's path.
PERF_SAMPLE = re.compile(
    r"^\s*(?P<thread>.+?)\s+(?P<pid>\d+)\s+[0-9a-f]+\s+(?P<function>.+?)\s+\((?P<dso>[^()]*)\)\s*$"
)


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


def perf_samples(data: Path) -> dict[int, Counter[tuple[str, str, str]]]:
    """The recording's samples by process: how many fell in each (thread name, library,
    function). Read from ``perf script``, not ``perf report --pid``, whose shares by function
    came from other processes than the one asked for."""
    done = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,pid,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=False,
    )
    samples: dict[int, Counter[tuple[str, str, str]]] = {}
    for line in done.stdout.splitlines():
        if match := PERF_SAMPLE.match(line):
            library = Path(match["dso"]).name
            key = (match["thread"], library, f"{library} {match['function']}")
            samples.setdefault(int(match["pid"]), Counter())[key] += 1
    return samples


PERF_KEYS = {"thread": 0, "library": 1, "function": 2}


def perf_shares(samples: Counter[tuple[str, str, str]], key: str) -> dict[str, float]:
    """One process's samples by ``key`` (``thread``, ``library`` or ``function``), each
    one's share of them, largest first."""
    index = PERF_KEYS[key]
    counts: Counter[str] = Counter()
    for keys, count in samples.items():
        counts[keys[index]] += count
    total = sum(counts.values())
    return {name: count / total for name, count in counts.most_common()}
