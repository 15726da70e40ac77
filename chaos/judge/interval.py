"""How often to checkpoint: Young/Daly from what the run measured.

Checkpointing too often wastes time writing; too rarely wastes time redoing
work after a failure. With a checkpoint cost of C seconds and a mean time
between failures of F seconds, the interval that minimises the sum is about
sqrt(2·C·F) (Young 1974; Daly 2006 refines it for large C). The harness
measures C (save_begin -> save_end) and the step time in the fault-free
reference run, so the report can say what the target does now and what
the formula recommends at a realistic failure rate (large jobs see about
one interruption every 3 hours). The arithmetic is pure so it is tested
with known numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import mean
from typing import Any

from torchchaos.judge.evidence import Evidence
from torchchaos.rundir.history import History

DEFAULT_MTBF_HOURS = 3.0


def young_daly(cost_seconds: float, mtbf_seconds: float) -> float:
    """The checkpoint interval (seconds of work between saves) that minimises waste."""
    if cost_seconds < 0 or mtbf_seconds <= 0:
        raise ValueError("checkpoint cost must be >= 0 and MTBF > 0")
    return math.sqrt(2.0 * cost_seconds * mtbf_seconds)


def overhead(interval_seconds: float, cost_seconds: float, mtbf_seconds: float) -> float:
    """Expected fraction of time lost at this interval, to first order: the
    checkpoint cost paid every interval plus, per failure, half an interval
    redone (C/T + T/2F). At the Young/Daly interval it is sqrt(2C/F)."""
    if interval_seconds <= 0:
        raise ValueError("interval must be > 0 seconds")
    return cost_seconds / interval_seconds + interval_seconds / (2.0 * mtbf_seconds)


@dataclass
class Measured:
    cost_seconds: float  # mean save_begin -> save_end
    saves: int  # how many finished saves the mean is over
    step_seconds: float | None  # mean time of one training step, saves left out


def _save_windows(history: History) -> list[tuple[float, float]]:
    begins = {(e.get("pid"), e.get("save")): e["t"] for e in history.of("save_begin")}
    return [(begins[key], e["t"]) for e in history.of("save_end")
            if (key := (e.get("pid"), e.get("save"))) in begins]


def _step_seconds(history: History, saves: list[tuple[float, float]]) -> float | None:
    """Mean gap between consecutive steps of one process, leaving out the gaps a save
    overlaps (the writer saves; its peers wait for it in the next collective)."""
    by_pid: dict[Any, list[float]] = {}
    for e in history.steps():
        by_pid.setdefault(e.get("pid"), []).append(e["t"])
    gaps = [(a, b) for times in by_pid.values() for a, b in zip(times, times[1:])]
    clean = [b - a for a, b in gaps if not any(s < b and e > a for s, e in saves)]
    chosen = clean or [b - a for a, b in gaps]
    return mean(chosen) if chosen else None


def measure(history: History) -> Measured | None:
    """Checkpoint cost and step time as one run saw them; None without a finished save."""
    windows = _save_windows(history)
    if not windows:
        return None
    return Measured(mean(end - begin for begin, end in windows), len(windows),
                    _step_seconds(history, windows))


def recommend(measured: Measured, mtbf_hours: float,
              interval_steps: int | None) -> dict[str, Any]:
    """The report's `checkpoint` field: what the target does now, what Young/Daly says."""
    mtbf = mtbf_hours * 3600.0
    best = young_daly(measured.cost_seconds, mtbf)
    step = measured.step_seconds
    now_seconds = interval_steps * step if interval_steps and step else None
    return {
        **asdict(measured),
        "mtbf_hours": mtbf_hours,
        "interval_steps": interval_steps,
        "interval_seconds": now_seconds,
        "overhead_now": overhead(now_seconds, measured.cost_seconds, mtbf)
        if now_seconds else None,
        "young_daly_seconds": best,
        "young_daly_steps": max(1, round(best / step)) if step else None,
        "overhead_young_daly": overhead(best, measured.cost_seconds, mtbf) if best else None,
    }


def advice(evidence: Evidence, mtbf_hours: float = DEFAULT_MTBF_HOURS) -> dict[str, Any] | None:
    """The report's `checkpoint` field for a run: cost and step time measured in the
    fault-free reference (no failure skews them), else in the chaos run; the interval the
    target uses now is the one `bounded_lost_work` bounds lost steps with."""
    measured = measure(evidence.reference) or measure(evidence.chaos)
    if measured is None:
        return None
    return recommend(measured, mtbf_hours, evidence.checkpoint_interval())


def summary(data: dict[str, Any]) -> str:
    """One line for the terminal table."""
    now = (f"every {data['interval_steps']} steps" if data.get("interval_steps")
           else "interval unknown")
    if data.get("interval_seconds"):
        now += f" ({format_seconds(data['interval_seconds'])})"
    best = format_seconds(data["young_daly_seconds"])
    if data.get("young_daly_steps"):
        best += f" = {data['young_daly_steps']} steps"
    return (f"checkpoint: costs {format_seconds(data['cost_seconds'])}, saved {now}; Young/Daly at"
            f" MTBF {data['mtbf_hours']:g} h recommends every {best}")


def format_seconds(value: float) -> str:
    """Seconds a person reads at a glance: 12 ms, 3.4 s, 19.0 min, 2.5 h."""
    if value < 1:
        return f"{value * 1000:.3g} ms"
    if value < 120:
        return f"{value:.3g} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"
