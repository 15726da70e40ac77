"""Crash-point enumeration: one chaos run per file event of one checkpoint save.

The fault-free reference run is the dry run: its history holds every file
event (open for writing, write, fsync, rename, remove, mkdir) of every save
on every rank. Each point crashes the job at one of them, in one of these
modes:

- `kill`: the rank is SIGKILLed right after the event (the page cache
  survives, as after a process crash);
- `lose_unsynced`: a power loss right after the event (what was not fsynced
  is gone; needs the fault filesystem);
- `torn`: the event's write reaches the disk only in part, then the job
  crashes (write events only; armed right after the event before it);
- `stop` (per point only: nothing on disk changes, so it is no crash state of
  a recording): the rank is SIGSTOPped right after the event, alive to
  torchrun, so only the job's own collective timeout or watchdog ends its
  peers' wait for it.

With more points than `cap`, a seeded sample is run. Each point is judged
like any scenario; the table says which event broke the protocol.

A point need not replay the training before the save under test: the
reference run also copies the checkpoint folders as they were once the save
before it ended (`env.SNAPSHOT_AFTER_SAVE`), and `kill` and `torn` points
start from that copy (the target resumes from it, as after any restart),
crash in their first save, and stop a few steps after the recovery
(`Scenario.stop_after`). `lose_unsynced` points start at step 0: what a power
loss takes depends on which of the earlier saves' data was fsynced, which a
copy does not carry (seeded as durable, it would hide a missing fsync).

`lose_unsynced` and `torn` points mount the fault filesystem over the folder
the save writes in (`History.checkpoint_dir`); a save that writes in several
top-level folders of the run directory is a usage error for them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from torchchaos import env
from torchchaos.errors import CannotJudge, UsageError
from torchchaos.explore.rows import Entry
from torchchaos.faults.storage import dir_pairs
from torchchaos.harness.reference import get_reference
from torchchaos.progress import Progress
from torchchaos.rundir.history import Event, History
from torchchaos.rundir.layout import RunLayout
from torchchaos.rundir.written import holds_bytes
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Spec, pairs

MODES = ("kill", "lose_unsynced", "torn")  # what a recording's crash states hold
PER_POINT_MODES = (*MODES, "stop")
T = TypeVar("T")


@dataclass(frozen=True)
class CrashPoint:
    rank: int
    event: Event  # the reference's file event the crash lands on
    mode: str
    folder: str = "ckpt"  # where the save writes: the fault filesystem's mount point

    @property
    def name(self) -> str:
        return (f"{self.mode} rank {self.rank} at #{self.event['index']}"
                f" {self.event['op']} {self.event['path']}")

    def spec(self, save: int) -> Spec:
        where = pairs(rank=self.rank, phase="checkpoint_save", save=save)
        index = self.event["index"]
        if self.mode == "kill":
            return Spec.make("kill", where, event=index)
        if self.mode == "stop":
            return Spec.make("hang", where, event=index, mode="stop")
        on = dir_pairs(self.folder)
        if self.mode == "lose_unsynced":
            return Spec.make("storage", pairs(mode="lose_unsynced"), where, pairs(event=index), on)
        # armed before this write
        return Spec.make("storage", pairs(mode="torn"), where, pairs(event=index - 1), on)


def enumerate_points(events: list[Event], modes: list[str],
                     folder: str = "ckpt") -> list[CrashPoint]:
    """Every (event x mode x rank) that makes sense for these file events; storage
    modes act on `folder`."""
    points = []
    for event in sorted(events, key=lambda e: (e["rank"], e["index"])):
        for mode in modes:
            if mode == "torn" and (event["op"] != "write" or event["index"] < 2):
                continue
            points.append(CrashPoint(event["rank"], event, mode, folder))
    return points


def storage_folder(history: History, save: int, modes: list[str]) -> str:
    """The folder the storage modes' fault filesystem goes on: where save `save` writes
    ("ckpt" when only kills are asked for: no mount)."""
    if not set(modes) & {"lose_unsynced", "torn"}:
        return "ckpt"
    folder = history.checkpoint_dir(save)
    if folder is None:
        raise UsageError(f"save {save} writes in several top-level folders of the run"
                         " directory (or outside it): lose_unsynced and torn points need"
                         " one folder to mount the fault filesystem on; use --mode kill")
    return folder


def check_modes(modes: list[str], known: tuple[str, ...] = MODES) -> None:
    unknown = [m for m in modes if m not in known]
    if "stop" in unknown:  # known here, where a recording's states are judged
        raise UsageError("--mode stop needs --per-point: a stopped rank changes nothing on"
                         " disk, so it is no crash state of a recording; each stop runs as a"
                         " chaos run of its own")
    if unknown:
        raise UsageError(f"unknown crash mode {unknown[0]!r} (known: {', '.join(known)})")


def sample(points: list[T], cap: int | None, seed: int) -> list[T]:
    """At most `cap` of `points`, a seeded sample in their order."""
    if cap is None or len(points) <= cap:
        return points
    chosen = random.Random(seed).sample(range(len(points)), cap)
    return [points[i] for i in sorted(chosen)]


@dataclass
class PointPlan:
    points: list[CrashPoint]  # the sample to run
    total: int  # points there are in all
    start_from: Path | None  # the checkpoints before the save under test, if snapshotted


def plan(base: Scenario, cache_dir: Path, progress: Progress, save: int, modes: list[str],
         cap: int | None, from_snapshot: bool = True) -> PointPlan:
    """The sampled points of save `save`. With `from_snapshot` (and a save before it),
    the reference run also takes the snapshot the points start from: the variable
    asking for it goes into `base.env`, so the points' runs find that same reference."""
    check_modes(modes, PER_POINT_MODES)
    from_snapshot = from_snapshot and save > 1
    if from_snapshot:
        base.env = {**base.env, env.SNAPSHOT_AFTER_SAVE: str(save - 1)}
    reference = get_reference(base, cache_dir, progress)
    history = reference.history()
    events = [e for e in history.of("file") if e.get("save") == save and e.get("launch") == 0]
    if not events:
        saves = max((e.get("save", 0) for e in history.of("file")), default=0)
        raise UsageError(f"the reference run made {saves} checkpoint save(s) with file events;"
                         f" --save {save} does not exist")
    points = enumerate_points(events, modes, storage_folder(history, save, modes))
    start_from = None
    if from_snapshot:
        start_from = RunLayout(reference.run_dir).snapshot_dir
        if not start_from.is_dir():
            raise CannotJudge(f"the reference run took no snapshot after save {save - 1}"
                              " (rank 0 saw no file event of it)")
        if holder := _holds_path(start_from, reference.run_dir):
            progress(f"crash points start from step 0: the checkpoint {holder} holds the"
                     f" reference run's own folder {reference.run_dir}, so a copy of it"
                     " would not resume as the job does")
            start_from = None
    return PointPlan(sample(points, cap, base.seed), len(points), start_from)


def _holds_path(snapshot: Path, run_dir: Path) -> str | None:
    """The first snapshot file that holds `run_dir`'s absolute path: a checkpoint that
    records where it was written (Lightning's dirpath, say) resumes differently once
    copied into another run directory."""
    needle = str(run_dir.resolve())
    for path in sorted(p for p in snapshot.rglob("*") if p.is_file()):
        if holds_bytes(path, needle):
            return str(path.relative_to(snapshot))
    return None


def entries(found: PointPlan, save: int) -> list[Entry]:
    """The points as battery entries. A run started from the snapshot taken after save
    `save - 1` makes the save under test first in every process: `save=1`."""
    result = []
    for point in found.points:
        if found.start_from is not None and point.mode != "lose_unsynced":
            result.append(Entry(point.name, point.spec(1), start_from=str(found.start_from)))
        else:
            result.append(Entry(point.name, point.spec(save)))
    return result
