"""Print a table from a locust run of loadtests/locustfile.py (its --csv prefix).

python loadtests/report.py /tmp/run
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path


def rows(prefix: str) -> dict[str, dict[str, str]]:
    with Path(f"{prefix}_stats.csv").open() as handle:
        return {row["Type"]: row for row in csv.DictReader(handle) if row["Name"] != "Aggregated"}


def total(row: dict[str, str]) -> float:
    return float(row["Average Response Time"]) * int(row["Request Count"])


def report(prefix: str) -> str:
    stats = rows(prefix)
    http, ttft, speed = stats["POST"], stats["TTFT"], stats["TOKENS_PER_S"]
    hit_rate = total(stats["CACHED_TOKENS"]) / max(total(stats["INPUT_TOKENS"]), 1)
    lines = [
        "| requests | failures | TTFT p50 / p90 / p99 (ms) | tokens/s p50 | cached-token share |",
        "| --- | --- | --- | --- | --- |",
        f"| {http['Request Count']} | {http['Failure Count']} "
        f"| {ttft['50%']} / {ttft['90%']} / {ttft['99%']} | {speed['50%']} | {hit_rate:.3f} |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(sys.argv[1]))
