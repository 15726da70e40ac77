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

from torchchaos.faults.hang import COLLECTIVES as HELD_IN
from torchchaos.incident.attribute import LOADER_WAIT, Incident
from torchchaos.scenario.spec import Pairs, Spec, pairs

if TYPE_CHECKING:
    from torchchaos.rundir.history import History
    from torchchaos.scenario.model import Scenario

# What the harness cannot inject is replayed by its nearest kind, and said.
STAND_IN_NOTES = {
    "unknown": "the artefacts name no fault: a kill of a rank that does not write"
               " checkpoints, between two of them, stands in for it",
}
# Native crashes the `crash` kind makes for real; other signals are sent by `kill`.
CRASH_SIGNALS = {"SIGSEGV": "segv", "SIGABRT": "abrt", "SIGBUS": "bus"}


@dataclass
class Placement:
    """Where the replay script puts things: from its reference run, or the incident's own."""

    writer: int = 0
    last_rank: int = 1
    between: int | None = None   # a step between two checkpoints
    in_save: Pairs = pairs(phase="checkpoint_save", save=2, event=1)  # a trigger
    # the battery's kill right after a rename in the save: late in it, where a save that
    # every rank takes part in has the others inside it too
    late_in_save: Pairs | None = None
    torn: Spec | None = None      # the battery's torn-write spec, where the script has one
    power_loss: Spec | None = None
    source: str = "the incident's own steps"
    first_save: int | None = None  # the replay script's first save, after that step
    interval: int | None = None    # and the steps between its saves

    @property
    def from_reference(self) -> bool:
        return self.source != Placement.source


def placement_from_reference(history: History, scenario: Scenario) -> Placement:
    """Placed as the battery places its rows on this script's reference run."""
    from torchchaos.explore import battery

    faults = [(e.name, e.fault) for e in battery.plan_from(history, scenario, lambda _m: None)]
    writer = str(history.checkpoint_writer())
    between = next(int(step) for _, f in faults if f.kind == "kill" and f.get("rank") == "0"
                   and (step := f.get("step")) and f.get("signal") is None)
    in_saves = [(name, f) for name, f in faults if f.kind == "kill" and f.get("rank") == writer
                and f.get("phase") == "checkpoint_save" and f.get("save") == "2"]
    in_save = next((f.trigger() for _, f in in_saves), None)
    late = next((f.trigger() for name, f in in_saves if "after a rename" in name), None)
    torn = next((f for _, f in faults if f.kind == "storage" and f.get("mode") == "torn"), None)
    power = next((f for _, f in faults if f.get("mode") == "lose_unsynced"), None)
    saves = history.of("save_begin")
    return Placement(writer, scenario.world_size - 1, between, in_save or Placement.in_save,
                     late, torn, power, "the replay script's fault-free reference run",
                     saves[0].get("after_step") if saves else None,
                     history.save_interval() or None)


def faults_for(incident: Incident, place: Placement,
               same_script: bool) -> list[tuple[Spec, str]]:
    """(spec, note) pairs that replay the incident: its first failure, then the restart's
    failure where that was a fault of its own."""
    return _first_failure(incident, place, same_script) + \
        _restart_failure(incident, place, same_script)


def _restart_failure(incident: Incident, place: Placement,
                     same_script: bool) -> list[tuple[Spec, str]]:
    """A restart whose load raised on data that was fine (an I/O error, a timeout) met a
    fault of its own: replayed as that exception out of the resume's first read. One whose
    data was bad (a file that does not load) is the script's own doing after the first
    failure, which the replay of that failure reproduces, and which a fixed script then
    passes: injecting it would keep the incident failing after the fix."""
    failed = incident.restart_failure
    if failed is None or failed.phase != "load" or failed.bad_data \
            or incident.finding.phase == "load" or failed.rank is None:
        return []
    rank = _replay_rank(failed.rank, failed.role, place, same_script)
    return [(Spec.make("raise", rank=rank, phase="checkpoint_load", event=1,
                     type=exception_name(failed.how)),
             f"then the restart's load on rank {failed.rank} raised {failed.how[:100]}"
             f" ({failed.source}), with nothing in the error saying the checkpoint was bad")]


def _first_failure(incident: Incident, place: Placement,
                   same_script: bool) -> list[tuple[Spec, str]]:
    f = incident.finding
    rank = _rank(incident, place, same_script)
    step, why = _step(incident, place, same_script)
    at = pairs(step=step)
    power_loss = place.power_loss or Spec.make("storage", mode="lose_unsynced",
                                             rank=place.writer).plus(at)
    torn = place.torn or Spec.make("storage", mode="torn", via="agent",
                                 rank=place.writer).plus(place.in_save)
    if f.kind == "node" and "power_loss" in f.alternatives and \
            incident.recovery.startswith("restarted from scratch"):
        return [(power_loss, "the node went down and its relaunch said it found no checkpoint:"
                       " what the job had saved was gone, which a node's death alone does"
                       " not do (its checkpoint stays for the restart) and a power loss"
                       " does; replayed as the power loss")]
    if f.kind == "node" and f.phase == "mid_save":
        return [(torn, "the node went down inside a save: replayed as its last write cut"
                       " short and the whole job killed there")]
    if f.kind == "node":
        return [(Spec.make("kill", pairs(node=0), at), f"the node went down ({f.how}); {why}")]
    if f.kind == "torn_write":
        return [(torn, "a checkpoint file that does not load: its last write torn")]
    if f.kind == "power_loss":
        return [(power_loss, "a power loss: what was not fsynced is gone")]
    if f.kind == "hang" and f.how == LOADER_WAIT:
        return [(Spec.make("dataloader", pairs(rank=rank), at, mode="stop"),
                 f"rank {rank}'s DataLoader worker stops; the rank waits for its batch and"
                 f" the others for the rank; {why}")]
    if f.kind == "hang":
        mode = "collective" if f.collective or f.phase_seen else "stop"
        held = None
        if same_script and f.collective in HELD_IN:  # the calls `hang op=` can hold
            # the peers waited in that call: the rank is held in its next one, so they
            # wait there again (a backward's all-reduce where the call is not named)
            mode, held = "collective", f.collective
        return [(Spec.make("hang", pairs(rank=rank), at, mode=mode, op=held),
                 f"rank {rank} stops making progress; the others wait ({f.how}"
                 f"{', in ' + f.collective if held else ''}); {why}")]
    kind, params = _kind_and_params(incident)
    who = pairs(rank=rank)
    note = STAND_IN_NOTES.get(f.kind, f"rank {rank} {_what(incident)}")
    if f.phase == "mid_save" and f.peers_in_save and place.late_in_save:
        return [(Spec.make(kind, who, place.late_in_save, params),
                 f"{note}, late inside a checkpoint save (right after a rename), where the"
                 " other ranks waited inside the save too, as in the incident")]
    if f.phase == "mid_save" and same_script and f.save:
        return [(Spec.make(kind, who, pairs(phase="checkpoint_save", save=f.save, event=1),
                         params),
                 f"{note}, at the start of the save the logs place it in (save {f.save}"
                 " of the launch)")]
    if f.phase == "mid_save":
        return [(Spec.make(kind, who, place.in_save, params),
                 f"{note}, inside a checkpoint save")]
    if f.phase in ("load", "after_resume"):
        first = (Spec.make("kill", who, at), "a first failure, so that there is a resume")
        trigger = pairs(phase="checkpoint_load", event=1) if f.phase == "load" \
            else pairs(step=step + 1)
        return [first, (Spec.make(kind, who, trigger, params),
                        f"{note}, {'while loading' if f.phase == 'load' else 'right after'}"
                        " the resume")]
    return [(Spec.make(kind, who, at, params), f"{note}; {why}")]


def _kind_and_params(incident: Incident) -> tuple[str, Pairs]:
    """The fault kind that makes what the rank died of, and its parameters."""
    f = incident.finding
    if f.kind == "oom" and f.how.startswith("allocation"):
        return "oom", pairs(mode="raise")  # the allocator's own error, raised out of a step
    if f.kind == "oom":
        return "oom", ()  # the kernel's OOM killer, under a cgroup limit on that rank
    if f.kind == "exception":
        return "raise", pairs(type=exception_name(f.how))
    if f.kind == "dataloader":
        return "dataloader", pairs(mode="kill")
    if f.kind == "abort":
        return "abort", ()
    if f.kind == "crash":  # another fatal signal (SIGILL, SIGFPE): the nearest, a NULL read
        return "crash", pairs(signal=CRASH_SIGNALS.get(f.how, "segv"))
    return "kill", pairs(signal="SIGTERM", grace=30) if f.kind == "preempt" else ()


def exception_name(how: str) -> str:
    """The built-in exception an error line names ("ValueError: ..."); RuntimeError for
    any other (torch's errors, the script's own classes), which `raise` cannot import."""
    import builtins

    name = how.split(":", 1)[0].strip().rsplit(".", 1)[-1]
    found = getattr(builtins, name, None)
    if name.isidentifier() and isinstance(found, type) and issubclass(found, Exception):
        return name
    return "RuntimeError"


def _what(incident: Incident) -> str:
    f = incident.finding
    if f.kind == "exception":
        return f"raises {f.how[:120]}"
    if f.kind == "oom" and f.how.startswith("allocation"):
        return "fails to allocate memory (the allocator's own error)"
    if f.kind == "oom":
        return "is killed by the kernel's OOM killer (its own memory cgroup limit)"
    if f.kind == "dataloader":
        return "loses a DataLoader worker (SIGKILL), and raises torch's own error for it"
    if f.kind == "abort":
        return "has its process group aborted under it; its next collective fails"
    return f"dies ({f.how or f.kind})"


def _rank(incident: Incident, place: Placement, same_script: bool) -> int:
    f = incident.finding
    return _replay_rank(f.rank, f.role, place, same_script)


def _replay_rank(rank: int | None, role: str, place: Placement, same_script: bool) -> int:
    """The incident's rank on the same script; else the replay's rank of the same role."""
    if same_script and rank is not None and rank <= place.last_rank:
        return rank
    return place.writer if role == "writer" else place.last_rank


def _step(incident: Incident, place: Placement, same_script: bool) -> tuple[int, str]:
    """(the step, why there). On the same script, the last step the logs showed (a fault
    at `step=N` fires once step N is done, so the replay's last step is the incident's);
    on another, the same place between two saves, mapped onto the replay script's saves
    where both intervals are known; else the step between two checkpoints its reference
    run gives."""
    lo, _hi = incident.finding.step_window
    if same_script and lo is not None or place.between is None:
        return max(lo or 0, 1), f"placed from {place.source}"
    interval = incident.save_interval
    if lo is None or not interval or not place.interval or place.first_save is None \
            or lo % interval == 0:
        return place.between, f"placed from {place.source}"
    offset = lo % interval
    step = place.first_save + max(1, min(place.interval - 1,
                                         round(offset * place.interval / interval)))
    return step, (f"the incident's step {lo} is {offset} of the {interval} steps between its"
                  f" saves: step {step} is as far between the replay script's saves (every"
                  f" {place.interval} steps, from its reference run)")
