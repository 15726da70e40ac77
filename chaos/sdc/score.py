"""Scoring detectors from trial results: probabilities with intervals, latency, costs.

For each fault model and detector, over the trials whose fault changed the final
weights (a masked fault has nothing to detect; masked trials are counted apart):
detection probability with its 95 % Wilson interval, detection latency in steps (from
the step the fault struck to the step the detector fired: median and worst), and
whether the worst stays within a bound (the checkpoint interval: a detection later than
that leaves no clean checkpoint to roll back to). Over the clean trials: each
detector's false-alarm rate, with its interval. From the loop: each detector's cost
per step.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

Z95 = 1.959964


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (0, 1 for no trials)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) \
        / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Cell:
    model: str
    detector: str
    bit_class: str  # "" for all classes together
    trials: int
    corrupted: int  # the trials whose fault changed the final weights
    detected: int
    probability: float
    low: float
    high: float
    latency_median: float | None
    latency_worst: int | None
    within_bound: bool | None  # None: no bound asked, or nothing detected
    # what the job did next, by how often, where the detector decides it per trial
    decisions: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cells(results: list[dict[str, Any]], detectors: list[str], bound: int | None,
          by_bit_class: bool = False) -> list[Cell]:
    faulty = [r for r in results if r["model"] != "clean"]
    keys = sorted({(r["model"], r["bit_class"] if by_bit_class else "") for r in faulty})
    found = []
    for model, bit_class in keys:
        mine = [r for r in faulty if r["model"] == model
                and (not by_bit_class or r["bit_class"] == bit_class)]
        corrupted = [r for r in mine if r["corrupted"]]
        for detector in detectors:
            latencies = [r["detected"][detector] - r["step"] for r in corrupted
                         if r["detected"].get(detector) is not None]
            low, high = wilson(len(latencies), len(corrupted))
            worst = max(latencies) if latencies else None
            missed = len(latencies) < len(corrupted)
            within = None if bound is None or not corrupted else (
                not missed and worst is not None and worst <= bound)
            decisions = Counter(r.get("decided", {}).get(detector) for r in corrupted
                                if r["detected"].get(detector) is not None)
            decisions.pop(None, None)
            found.append(Cell(model, detector, bit_class, len(mine), len(corrupted),
                              len(latencies), len(latencies) / len(corrupted) if corrupted
                              else 0.0, low, high,
                              statistics.median(latencies) if latencies else None, worst,
                              within, dict(decisions.most_common())))
    return found


def false_alarms(results: list[dict[str, Any]], detectors: list[str]
                 ) -> dict[str, dict[str, float | int]]:
    clean = [r for r in results if r["model"] == "clean"]
    found: dict[str, dict[str, float | int]] = {}
    for detector in detectors:
        alarms = sum(1 for r in clean if r["detected"].get(detector) is not None)
        low, high = wilson(alarms, len(clean))
        found[detector] = {"clean": len(clean), "alarms": alarms,
                           "rate": alarms / len(clean) if clean else 0.0,
                           "low": low, "high": high}
    return found


def requirement_failures(table: list[Cell], alarms: dict[str, dict[str, float | int]],
                         required: dict[str, float], max_false: float | None,
                         bound: int | None) -> list[str]:
    """What the campaign was asked to show and did not, one line each. `required`:
    'detector' or 'detector/model' to the lowest detection probability its interval's
    low end may have."""
    failures = []
    for cell in table:
        for key in (cell.detector, f"{cell.detector}/{cell.model}"):
            if key in required and cell.corrupted and cell.low < required[key]:
                failures.append(f"{cell.detector} on {cell.model}: detected {cell.detected}"
                                f" of {cell.corrupted}, interval low end {cell.low:.3f} <"
                                f" {required[key]:g}")
        if bound is not None and cell.within_bound is False and (
                cell.detector in required or f"{cell.detector}/{cell.model}" in required):
            failures.append(f"{cell.detector} on {cell.model}: worst latency"
                            f" {cell.latency_worst} step(s) or a miss, bound {bound}")
    if max_false is not None:
        for detector, seen in alarms.items():
            if seen["clean"] and seen["high"] > max_false:
                failures.append(f"{detector}: false alarms {seen['alarms']} of {seen['clean']}"
                                f" clean trials, interval high end {seen['high']:.3f} >"
                                f" {max_false:g}")
    return failures


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}"


def _then(cell: Cell, actions: dict[str, str]) -> str:
    """What the job did next: the detector's decisions with their counts where it
    decides per trial, else the action declared for it."""
    if cell.decisions:
        return ", ".join(f"{what} {count}" for what, count in cell.decisions.items())
    return actions.get(cell.detector, "")


def table_text(table: list[Cell], alarms: dict[str, dict[str, float | int]],
               costs: dict[str, Any], actions: dict[str, str]) -> str:
    """The campaign's table as the terminal shows it."""
    w = max([18, *(len(c.detector) for c in table), *(len(d) for d in alarms)])
    lines = [f"{'model':<11} {'detector':<{w}} {'detected':>9} {'P %':>6} {'95 % interval':>15}"
             f" {'latency':>8} {'worst':>5} {'masked':>6}  then"]
    for cell in table:
        interval = f"[{_pct(cell.low)}, {_pct(cell.high)}]"
        latency = "-" if cell.latency_median is None else f"{cell.latency_median:g}"
        worst = "-" if cell.latency_worst is None else str(cell.latency_worst)
        bound = "" if cell.within_bound is None else (" in bound" if cell.within_bound
                                                      else " OUT of bound")
        lines.append(f"{cell.model:<11} {cell.detector:<{w}} {cell.detected:>4}/{cell.corrupted:<4}"
                     f" {_pct(cell.probability):>6} {interval:>15} {latency:>8} {worst:>5}"
                     f" {cell.trials - cell.corrupted:>6}  {_then(cell, actions)}{bound}")
    lines.append("")
    lines.append(f"{'detector':<{w}} {'false alarms':>12} {'95 % interval':>15} {'ms/step':>8}")
    for detector, seen in alarms.items():
        interval = f"[{_pct(float(seen['low']))}, {_pct(float(seen['high']))}]"
        cost = costs.get("check_ms", {}).get(detector)
        lines.append(f"{detector:<{w}} {seen['alarms']:>5}/{seen['clean']:<6} {interval:>15}"
                     f" {'-' if cost is None else f'{cost:.3f}':>8}")
    return "\n".join(lines)


def plot_svg(table: list[Cell], title: str) -> str:
    """Detection probability by model (rows; by model and bit class for cells that have
    one) and detector (bars), with the intervals as whiskers: a small SVG, no plotting
    library."""
    def row(c: Cell) -> str:
        return f"{c.model} {c.bit_class}".strip()

    models = list(dict.fromkeys(row(c) for c in table))
    detectors = list(dict.fromkeys(c.detector for c in table))
    bar, gap, left, top, width = 12, 10, 150, 40, 400
    height = top + len(models) * (len(detectors) * bar + gap) + 60
    colours = ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 190}"'
           f' height="{height}" font-family="sans-serif" font-size="11">',
           f'<text x="10" y="20" font-size="13">{_escape(title)}</text>']
    y = top
    for model in models:
        out.append(f'<text x="10" y="{y + len(detectors) * bar / 2 + 4}">{_escape(model)}</text>')
        for k, detector in enumerate(detectors):
            cell = next((c for c in table if row(c) == model and c.detector == detector), None)
            if cell is not None:
                colour = colours[k % len(colours)]
                out.append(f'<rect x="{left}" y="{y}" width="{cell.probability * width:.1f}"'
                           f' height="{bar - 2}" fill="{colour}"/>')
                mid = y + (bar - 2) / 2
                out.append(f'<line x1="{left + cell.low * width:.1f}" y1="{mid}"'
                           f' x2="{left + cell.high * width:.1f}" y2="{mid}" stroke="black"/>')
            y += bar
        y += gap
    for tick in range(0, 101, 25):
        x = left + tick / 100 * width
        out.append(f'<line x1="{x}" y1="{top - 5}" x2="{x}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{x - 8}" y="{y + 14}">{tick} %</text>')
    for k, detector in enumerate(detectors):
        out.append(f'<rect x="{left + width + 20}" y="{top + 16 * k}" width="10" height="10"'
                   f' fill="{colours[k % len(colours)]}"/>')
        out.append(f'<text x="{left + width + 35}" y="{top + 16 * k + 9}">'
                   f'{_escape(detector)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
