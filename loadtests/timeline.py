"""A replay's figures over time: from each turn's outcome (loadtests/locustfile.py with
OUTCOMES_FILE) and samples of the engine's replicas, one row per window of time, written as CSV
and drawn as an SVG picture (no plotting library: the picture is a few polylines).

Each row: the window's end (seconds from the start), the engine replicas running, starting and
stopping at its end, the turns in flight then, the turns that ended in it and how many of those
failed, and of the turns that started in it the TTFT p90 and the token-weighted prefix-cache hit
rate (cached input tokens over input tokens).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape


@dataclass
class Row:
    t: float
    running: int
    starting: int
    stopping: int
    in_flight: int
    turns: int
    failed: int
    ttft_p90_ms: float | None
    hit_rate: float | None


def acked(turns: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [turn for turn in turns if turn["outcome"] == "acked"]


def hit_rate(turns: Iterable[dict[str, Any]]) -> float | None:
    """Token-weighted: the acknowledged turns' cached input tokens over their input tokens."""
    done = acked(turns)
    total = sum(turn["input_tokens"] for turn in done)
    return sum(turn["cached_tokens"] for turn in done) / total if total else None


def percentile(values: Sequence[float], share: float) -> float | None:
    """The nearest-rank percentile (``share`` in 0..1) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def rows(
    turns: Sequence[dict[str, Any]],
    samples: Sequence[dict[str, Any]],
    start: float,
    end: float,
    window_s: float = 5.0,
) -> list[Row]:
    """One `Row` per ``window_s`` from ``start`` to ``end`` (times as ``time.time()``)."""
    out = []
    count = max(1, math.ceil((end - start) / window_s))
    for index in range(count):
        low, high = start + index * window_s, start + (index + 1) * window_s
        sample = next((s for s in reversed(samples) if s["at"] <= high), None) or {}
        began = [turn for turn in turns if low <= turn["started_at"] < high]
        ended = [turn for turn in turns if low <= turn["at"] < high]
        ttfts = [turn["ttft_ms"] for turn in acked(began) if turn.get("ttft_ms") is not None]
        in_flight = sum(1 for turn in turns if turn["started_at"] <= high < turn["at"])
        out.append(
            Row(
                t=round(high - start, 1),
                running=sample.get("running", 0),
                starting=sample.get("starting", 0),
                stopping=sample.get("stopping", 0),
                in_flight=in_flight,
                turns=len(ended),
                failed=sum(1 for turn in ended if turn["outcome"] != "acked"),
                ttft_p90_ms=percentile(ttfts, 0.9),
                hit_rate=hit_rate(began),
            )
        )
    return out


def write_csv(table: Sequence[Row], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(Row.__dataclass_fields__))
        writer.writeheader()
        for row in table:
            writer.writerow(asdict(row))


# --- the picture ------------------------------------------------------------------------------

WIDTH, PANEL_H, LEFT, RIGHT, TOP, GAP = 900, 150, 70, 170, 40, 40


@dataclass
class Series:
    name: str
    values: Sequence[float | None]
    color: str
    dashed: bool = False
    step: bool = False  # a count: drawn as steps


@dataclass
class Panel:
    title: str
    series: Sequence[Series]
    y_max: float | None = None  # the axis' top; else the data's, rounded up
    unit: str = ""


def _nice_top(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _format(value: float) -> str:
    return f"{value:g}" if value >= 1 or value == 0 else f"{value:.2f}"


def svg(
    x: Sequence[float],
    panels: Sequence[Panel],
    title: str,
    marks: Sequence[tuple[float, str]] = (),
) -> str:
    """Panels stacked on one time axis (``x``, seconds), each with its series as lines (a
    ``None`` value breaks a line) and a legend; ``marks``: labelled vertical lines (events)."""
    height = TOP + len(panels) * (PANEL_H + GAP) + 10
    plot_w = WIDTH - LEFT - RIGHT
    x_max = max(x) if x else 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]

    def px(value: float) -> float:
        return LEFT + plot_w * value / x_max

    for index, panel in enumerate(panels):
        top = TOP + index * (PANEL_H + GAP)
        bottom = top + PANEL_H
        data = [v for s in panel.series for v in s.values if v is not None]
        y_max = panel.y_max or _nice_top(max(data, default=1.0))

        def py(value: float, top: float = top, y_max: float = y_max) -> float:
            return top + PANEL_H * (1 - min(value, y_max) / y_max)

        parts.append(
            f'<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL_H}" '
            'fill="none" stroke="#999"/>'
        )
        parts.append(
            f'<text x="{LEFT}" y="{top - 6}" font-weight="bold">{escape(panel.title)}</text>'
        )
        for tick in (0.0, y_max / 2, y_max):
            y = py(tick)
            parts.append(
                f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" '
                'stroke="#eee"/>'
            )
            label = f"{_format(tick)}{panel.unit}"
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        step = _nice_top(x_max / 8)
        tick = 0.0
        while tick <= x_max + 1e-9:
            parts.append(
                f'<text x="{px(tick):.1f}" y="{bottom + 14}" text-anchor="middle">{tick:g} s</text>'
            )
            tick += step
        for at, label in marks:
            parts.append(
                f'<line x1="{px(at):.1f}" y1="{top}" x2="{px(at):.1f}" y2="{bottom}" '
                'stroke="#888" stroke-dasharray="2,3"/>'
            )
            if index == 0:
                parts.append(
                    f'<text x="{px(at) + 3:.1f}" y="{top + 11}" fill="#555">{escape(label)}</text>'
                )
        for number, series in enumerate(panel.series):
            for line in _lines(x, series.values, series.step):
                points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in line)
                dash = ' stroke-dasharray="6,4"' if series.dashed else ""
                parts.append(
                    f'<polyline points="{points}" fill="none" stroke="{series.color}" '
                    f'stroke-width="1.8"{dash}/>'
                )
            y = top + 12 + 16 * number
            dash = ' stroke-dasharray="6,4"' if series.dashed else ""
            parts.append(
                f'<line x1="{LEFT + plot_w + 10}" y1="{y - 4}" x2="{LEFT + plot_w + 30}" '
                f'y2="{y - 4}" stroke="{series.color}" stroke-width="2"{dash}/>'
            )
            parts.append(f'<text x="{LEFT + plot_w + 35}" y="{y}">{escape(series.name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _lines(
    x: Sequence[float], values: Sequence[float | None], step: bool
) -> list[list[tuple[float, float]]]:
    """The points of each unbroken run of values (steps: held until the next x)."""
    lines: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    previous_x = 0.0
    for at, value in zip(x, values, strict=True):
        if value is None:
            if current:
                lines.append(current)
            current = []
        else:
            if step:
                current.append((previous_x, value))
            current.append((at, value))
        previous_x = at
    if current:
        lines.append(current)
    return lines


def picture(
    table: Sequence[Row],
    title: str,
    marks: Sequence[tuple[float, str]] = (),
    reference: Sequence[Row] | None = None,
    reference_name: str = "fixed size",
) -> str:
    """The replay's picture: turns in flight, engine replicas, TTFT p90 and hit rate over time;
    ``reference`` (another run of the same load, e.g. at a fixed size) drawn beside, dashed."""
    x = [row.t for row in table]

    def aligned(name: str) -> list[float | None]:
        values = [getattr(row, name) for row in reference or []]
        return (values + [None] * len(x))[: len(x)]

    load = [Series("turns in flight", [row.in_flight for row in table], "#555", step=True)]
    replicas = [
        Series("running", [row.running for row in table], "#1f77b4", step=True),
        Series("starting", [row.starting for row in table], "#2ca02c", step=True),
        Series("stopping", [row.stopping for row in table], "#d62728", step=True),
    ]
    ttft = [Series("TTFT p90", [row.ttft_p90_ms for row in table], "#9467bd")]
    hits = [Series("hit rate", [row.hit_rate for row in table], "#ff7f0e")]
    if reference is not None:
        load.append(Series(reference_name, aligned("in_flight"), "#aaa", dashed=True, step=True))
        replicas.append(Series(reference_name, aligned("running"), "#aaa", dashed=True, step=True))
        ttft.append(Series(reference_name, aligned("ttft_p90_ms"), "#aaa", dashed=True))
        hits.append(Series(reference_name, aligned("hit_rate"), "#aaa", dashed=True))
    panels = [
        Panel("load", load),
        Panel("engine replicas", replicas),
        Panel("TTFT p90", ttft, unit=" ms"),
        Panel("prefix-cache hit rate (token-weighted)", hits, y_max=1.0),
    ]
    return svg(x, panels, title, marks)


def cache_misses(turns: Iterable[dict[str, Any]], share: float = 0.9) -> list[dict[str, Any]]:
    """The later turns of a session that found less than ``share`` of the turn before them
    cached: each extends the one before (loadtests/traces.py), so on the replica that served
    that one its whole prompt is cached; a miss is a turn served elsewhere (moved, or spilled)."""
    previous: dict[str, dict[str, Any]] = {}
    misses = []
    for turn in sorted(acked(turns), key=lambda turn: turn["started_at"]):
        before = previous.get(turn["session"])
        if (
            before is not None
            and turn["turn"] == before["turn"] + 1
            and turn["cached_tokens"] < share * before["input_tokens"]
        ):
            misses.append(turn)
        previous[turn["session"]] = turn
    return misses
