"""What the history says about hangs and stragglers (for the `hang_detected` check).

- `describe_hang`: the harness's own finding, one clause per hung rank.
- `reaction`: after an injected hang began, when the job reacted on its own
  (a rank exited, the whole job exited, or the stall ended by itself).
- `step_seconds` / `straggling`: per-rank step times and what a slow rank
  cost the job.
- `cuts_in_force`: the harness faults (network partitions) in force at a time:
  the likely cause of a hang in which every rank just waits.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from torchchaos.rundir.history import Event, History


def describe_hang(hang: dict[str, Any]) -> str:
    """'rank 1 stopped after step 25 in ...; rank 0 waiting after step 25 in ...'."""
    if hang.get("between_attempts"):
        agents = "; ".join(f"node {a['node']} in {a['where']}" for a in hang.get("agents", []))
        return (f"every rank had exited (ranks {hang['after_exit']}) and no new attempt started:"
                f" torchrun waits, {agents or 'no agent left'}")
    clauses = []
    for rank in hang["ranks"]:
        step = f"after step {rank['step']}" if rank["step"] else "before its first step"
        clauses.append(f"rank {rank['rank']} {rank['state']} {step} in {rank['where']}")
    text = "; ".join(clauses)
    if hang.get("after_exit"):
        text += f" (rank(s) {hang['after_exit']} had exited; the teardown itself hung)"
    return text


def cut_windows(history: History) -> list[tuple[Event, float]]:
    """Each harness fault window: its `nemesis_begin` event and when it healed
    (infinity: never, within the history)."""
    ended = {(e["id"], e["window"]): e["t"] for e in history.of("nemesis_end")}
    return [(e, ended.get((e["id"], e["window"]), float("inf")))
            for e in history.of("nemesis_begin")]


def cuts_in_force(history: History, t: float) -> list[Event]:
    """The `nemesis_begin` events of harness faults that were in force at time `t`."""
    return [begin for begin, end in cut_windows(history) if begin["t"] <= t < end]


def describe_cuts(cuts: list[Event], t: float) -> str:
    """' while partition 1 | 0 was in force (for 3.2 s)'."""
    return "".join(f" while {c['kind']} {c.get('nodes', '')} was in force (for"
                   f" {t - c['t']:.1f} s)" for c in cuts)


@dataclass
class Reaction:
    began: Event  # the fault's hang_begin
    seconds: float | None  # from the hang to the job's own reaction; None: it never reacted
    how: str


def reaction(history: History) -> Reaction | None:
    """How the job reacted to the first injected hang, if one began."""
    began = history.of("hang_begin")
    if not began:
        return None
    start = began[0]
    after = [e for e in history.events if e["t"] > start["t"]]
    for event in after:
        if event["ev"] == "hang_end" and event.get("how") == "released":
            return Reaction(start, event["t"] - start["t"], "the stall ended by itself")
        if event["ev"] == "rank_exit":
            return Reaction(start, event["t"] - start["t"], f"rank {event['rank']} exited")
        if event["ev"] == "job_exit":
            return Reaction(start, event["t"] - start["t"], "the job exited")
        if event["ev"] == "hang":  # the harness had to step in
            return Reaction(start, None, "no reaction")
    return Reaction(start, None, "no reaction")


def step_seconds(history: History) -> dict[int, float]:
    """Each rank's mean time per step (between two steps of one process)."""
    by_rank: dict[int, list[float]] = {}
    last: dict[int, float] = {}
    for event in history.steps():
        pid = event["pid"]
        if pid in last:
            by_rank.setdefault(event["rank"], []).append(event["t"] - last[pid])
        last[pid] = event["t"]
    return {rank: statistics.fmean(times) for rank, times in sorted(by_rank.items())}


def straggling(chaos: History, reference: History, wall: float,
               reference_wall: float) -> dict[str, Any] | None:
    """Per-rank step times next to the reference's and the job's slowdown, when a
    straggler fault fired."""
    slowed = chaos.of("straggler")
    if not slowed:
        return None
    ranks = step_seconds(chaos)
    return {
        "straggler_ranks": sorted({e["rank"] for e in slowed}),
        "delay": slowed[0]["delay"],
        "step_seconds": {str(r): round(s, 4) for r, s in ranks.items()},
        "reference_step_seconds": {str(r): round(s, 4)
                                   for r, s in step_seconds(reference).items()},
        "slowdown": round(wall / reference_wall, 2) if reference_wall else None,
    }
