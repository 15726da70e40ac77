"""pause_absorbed: the job went on through every pause without a restart.

A check is a pure function of the evidence (the chaos run's history next to
the fault-free reference's) to a CheckResult: ok True (held), False (the
target has a bug) or None (nothing to judge), and one sentence a person can
act on. It runs only when named: `torchchaos run --check pause_absorbed ...`.
"""

from __future__ import annotations

from torchchaos.judge.checkers import CheckResult
from torchchaos.judge.evidence import Evidence


def pause_absorbed(ev: Evidence) -> CheckResult:
    """Every pause (the `pause` kind's event) was followed by a step of every rank in
    the same attempt: the pause cost time, not a crash, a timeout or a restart."""
    pauses = ev.chaos.of("pause")
    if not pauses:
        return CheckResult(None, "no rank was paused: nothing to judge")
    ranks = ev.chaos.ranks()
    waits = []
    for pause in pauses:
        attempt = (pause["launch"], pause["attempt"])
        after = {}  # rank -> seconds from the pause to its next step in the same attempt
        for step in ev.chaos.steps():
            if (step["t"] > pause["t"] and (step["launch"], step["attempt"]) == attempt
                    and step["rank"] not in after):
                after[step["rank"]] = step["t"] - pause["t"]
        stuck = [r for r in ranks if r not in after]
        if stuck and pause["step"] < ev.reference.final_step():
            return CheckResult(False, f"rank {pause['rank']} paused {pause['seconds']:g} s after"
                                      f" step {pause['step']} and rank(s)"
                                      f" {', '.join(map(str, stuck))} never stepped again in"
                                      " that attempt: a stall cost a restart (is a collective"
                                      " timeout shorter than the pause?)",
                               {"stuck_ranks": stuck})
        waits.append(max(after.values(), default=0.0))
    return CheckResult(True, f"{len(pauses)} pause(s) absorbed: every rank went on in the same"
                             f" attempt (longest wait for a next step {max(waits):.1f} s)",
                       {"pauses": len(pauses), "longest_wait_s": round(max(waits), 3)})
