"""A fault whose trigger the job never reaches, told from its fault-free reference run.

`step=500` on a 60-step job, or the 4th save of a job that makes 3, never
fires: the run would go to its end and then say so. The reference run already
knows the job's last step, how many checkpoints each rank writes and how many
file events each save makes, so such a fault is refused before the run with
faults starts. A trigger on a resume's load is not checked (the reference run
resumes nothing), nor a time or a probability.
"""

from __future__ import annotations

from torchchaos.faults.contract import ResolvedFault
from torchchaos.rundir.history import History


def unreachable(faults: list[ResolvedFault], history: History, nproc: int) -> str | None:
    """Why the first of `faults` that cannot fire never would, or None."""
    for fault in faults:
        rank = fault.index if fault.target_type == "rank" else fault.index * nproc
        why = _never(fault, history, rank)
        if why:
            return (f"fault {fault.spec!r} would never fire: {why} (the job's fault-free"
                    " reference run); place it inside the job")
    return None


def _never(fault: ResolvedFault, history: History, rank: int) -> str | None:
    trig = fault.trigger
    if trig.step is not None:
        steps = [e["step"] for e in history.steps(rank)]
        if steps and trig.step > max(steps):
            return f"step={trig.step} is past rank {rank}'s last step, {max(steps)}"
    if trig.phase == "checkpoint_save":
        files = [e for e in history.of("file") if e.get("rank") == rank and e.get("save")]
        saves = max((e["save"] for e in files), default=0)
        if trig.save > saves:
            made = f"makes {saves} checkpoint save(s)" if saves else "writes no checkpoint"
            return f"save={trig.save}: rank {rank} {made}"
        events = sum(1 for e in files if e["save"] == trig.save)
        if trig.event > events:
            return (f"event={trig.event}: rank {rank}'s save {trig.save} makes {events} file"
                    " event(s)")
    return None
