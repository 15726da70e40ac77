"""The incident's fault as fault specs for the script and ranks at hand.

An incident seen on 512 ranks replays on the 2 or 4 of a CI job: what is kept
is the role (the rank that writes checkpoints or another, a whole node), the
phase (between saves, inside a save, the load of a resume) and the order of
events. The absolute step is kept only where the replay runs the same script
(`--script` not given); on another script the fault is placed from that
script's own fault-free reference run, as the battery places its rows: between
its two checkpoints, inside its 2nd save.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchchaos.incident.attribute import Incident

if TYPE_CHECKING:
    from torchchaos.rundir.history import History
    from torchchaos.scenario.model import Scenario

# What the harness cannot inject yet is replayed by its nearest kind, and said.
STAND_IN_NOTES = {
    "oom": "an OOM kill, replayed as the SIGKILL the OOM killer sends (no memory limit"
           " is applied)",
    "exception": "an exception, replayed as an exit with status 1 at the same place"
                 " (the traceback itself is not raised)",
    "unknown": "the artefacts name no fault: a kill of a rank that does not write"
               " checkpoints, between two of them, stands in for it",
}


@dataclass
class Placement:
    """Where the replay script puts things: from its reference run, or the incident's own."""

    writer: int = 0
    last_rank: int = 1
    between: int | None = None   # a step between two checkpoints
    in_save: str = "phase=checkpoint_save,save=2,event=1"
    torn: str | None = None      # the battery's torn-write spec, where the script has one
    power_loss: str | None = None
    source: str = "the incident's own steps"


def placement_from_reference(history: History, scenario: Scenario) -> Placement:
    """Placed as the battery places its rows on this script's reference run."""
    from torchchaos.explore import battery

    entries = battery.plan_from(history, scenario, lambda _m: None)
    writer = history.checkpoint_writer()
    between = next(int(e.fault.split("step=")[1].split(",")[0]) for e in entries
                   if e.fault.startswith("kill:rank=0,step="))
    in_save = next((e.fault.split(",", 1)[1] for e in entries
                    if e.fault.startswith(f"kill:rank={writer},phase=checkpoint_save")), None)
    torn = next((e.fault for e in entries if e.fault.startswith("storage:mode=torn")), None)
    power = next((e.fault for e in entries if "lose_unsynced" in e.fault), None)
    return Placement(writer, scenario.world_size - 1, between, in_save or Placement.in_save,
                     torn, power, "the replay script's fault-free reference run")


def faults_for(incident: Incident, place: Placement, same_script: bool) -> list[tuple[str, str]]:
    """(spec, note) pairs that replay the incident's first failure."""
    f = incident.finding
    rank = _rank(incident, place, same_script)
    step = _step(incident, place, same_script)
    at = f"step={step}"
    why = f"placed from {place.source}"
    if f.kind == "node" and f.phase == "mid_save":
        spec = place.torn or f"storage:mode=torn,via=agent,rank={place.writer},{place.in_save}"
        return [(spec, "the node went down inside a save: replayed as its last write cut"
                       " short and the whole job killed there")]
    if f.kind == "node":
        return [(f"kill:node=0,{at}", f"the node went down ({f.how}); {why}")]
    if f.kind == "torn_write":
        spec = place.torn or f"storage:mode=torn,via=agent,rank={place.writer},{place.in_save}"
        return [(spec, "a checkpoint file that does not load: its last write torn")]
    if f.kind == "power_loss":
        spec = place.power_loss or f"storage:mode=lose_unsynced,rank={place.writer},{at}"
        return [(spec, "a power loss: what was not fsynced is gone")]
    if f.kind == "hang":
        mode = "collective" if f.collective or f.phase_seen else "stop"
        return [(f"hang:rank={rank},{at},mode={mode}",
                 f"rank {rank} stops making progress; the others wait ({f.how}); {why}")]
    params = {"preempt": ",signal=SIGTERM,grace=30", "crash": f",signal={f.how or 'SIGSEGV'}",
              "exception": ",signal=exit,code=1"}.get(f.kind, "")
    note = STAND_IN_NOTES.get(f.kind, f"rank {rank} dies ({f.how or f.kind})")
    if f.phase == "mid_save":
        return [(f"kill:rank={rank},{place.in_save}{params}",
                 f"{note}, inside a checkpoint save")]
    if f.phase in ("load", "after_resume"):
        first = (f"kill:rank={rank},{at}", "a first failure, so that there is a resume")
        trigger = "phase=checkpoint_load,event=1" if f.phase == "load" else f"step={step + 1}"
        return [first, (f"kill:rank={rank},{trigger}{params}",
                        f"{note}, {'while loading' if f.phase == 'load' else 'right after'}"
                        " the resume")]
    return [(f"kill:rank={rank},{at}{params}", f"{note}; {why}")]


def _rank(incident: Incident, place: Placement, same_script: bool) -> int:
    f = incident.finding
    if same_script and f.rank is not None and f.rank <= place.last_rank:
        return f.rank
    return place.writer if f.role == "writer" else place.last_rank


def _step(incident: Incident, place: Placement, same_script: bool) -> int:
    """The step after the last one the logs showed, on the same script; else the step
    between two checkpoints the replay script's reference run gives."""
    lo, _hi = incident.finding.step_window
    if same_script and lo is not None or place.between is None:
        return (lo or 0) + 1
    return place.between
