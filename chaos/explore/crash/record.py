"""The recording run as a crash-state sweep reads it, and where each state's crash falls.

The recording run makes the save under test once, on the fault filesystem,
which logs every operation on the folder and keeps their bytes (the blob file).
A `Record` is that run read back: its history, the save's operations, their
bytes. `Places` puts each planned state's crash in it: the moment, the rank
whose operation it follows, and the chaos-run fault nearest it (`--per-point`
replays that one). `states` plans the states from the operations; `sweep`
judges each state's recovery against the record.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from torchchaos.errors import CannotJudge
from torchchaos.explore.crash.extents import Blobs
from torchchaos.explore.crash.states import Ranks, StateSpec, replayable
from torchchaos.faults.storage import dir_pairs
from torchchaos.rundir.history import Event, History
from torchchaos.rundir.layout import RunLayout
from torchchaos.scenario.spec import Spec, pairs


@dataclass
class Record:
    """The recording run: its history, the operations on the folder and their bytes."""

    run_dir: Path
    history: History
    ops: list[Event]
    blobs: Blobs  # the recording's blob file, read in place
    first: int  # index of the save's first operation
    end: float  # the moment the job went on after the save (its first `stopped`)


def load_record(run_dir: Path, save: int) -> Record:
    """A recording run's record, from its folder (a merge reads a shard's)."""
    history = History.of_run(run_dir)
    ops = replayable(history.of("fs"))
    saved = [e["t"] for e in history.of("save_begin") if e.get("save") == save]
    if not saved:
        raise CannotJudge(f"the recording run made no save {save}")
    # the save starts after its rank's last step: ops from then on are the save's; and
    # after what the saves before it wrote up to its start (an async writer finishes the
    # save before as late as this save's start: those ops are that save's, not this one's)
    start = min(saved)
    last_step = max((e["t"] for e in history.steps() if e["t"] <= start), default=0.0)
    earlier = max((e["t"] for e in history.of("file") if 0 < e.get("save", 0) < save
                   and e["t"] <= start), default=0.0)
    first = next((n for n, e in enumerate(ops) if e["t"] > max(last_step, earlier)), len(ops))
    end = min(e["t"] for e in history.of("stopped"))
    blobs = next(iter(sorted((RunLayout(run_dir).chaos_dir / "faultfs").glob("*.blobs"))))
    return Record(run_dir, history, ops, Blobs(blobs), first, end)


def ranks_of(record: Record) -> Ranks | None:
    """Who made each operation and when each rank entered its collectives; None where a
    collective of a subgroup was seen (not every rank waits there)."""
    syncs = record.history.of("sync")
    if any(e.get("group") != "world" for e in syncs):
        return None
    rank_of = {e["pid"]: e["rank"] for e in record.history.of("boot")}
    entered: dict[int, list[float]] = {}
    for e in syncs:
        entered.setdefault(e["rank"], []).append(e["t"])
    return Ranks([rank_of.get(op.get("tgid", op.get("pid"))) for op in record.ops], entered)


@dataclass
class PlacedCrash:
    """Where a state's crash falls in the record, and the chaos-run fault nearest it."""

    t_cut: float
    rank: int
    process: Event  # the boot event of the crashed rank's process
    spec: Spec
    # when the filesystem saw the next operation of the process the crash follows: that
    # process's word for its last operation comes before it (its calls return in order),
    # though on a busy machine often after another rank's next operation
    t_next: float = float("inf")
    writer: int | None = None  # that process (its pid), None before the save began


def _owner(op: Event) -> int | None:
    """The process that made a filesystem operation (the thread's, where it says)."""
    return op.get("tgid", op.get("pid"))


def _next_of_same_process(record: Record) -> list[float]:
    """For each operation, when the filesystem saw the next one of the same process
    (the job's going on after the save where there is none): one pass, back to front."""
    after: dict[int | None, float] = {}
    found = [record.end] * len(record.ops)
    for number in range(len(record.ops) - 1, -1, -1):
        who = _owner(record.ops[number])
        found[number] = after.get(who, record.end)
        after[who] = record.ops[number]["t"]
    return found


class Places:
    """Where each planned state's crash falls in the record (looked up once per record:
    a save of 1 GB per rank has thousands of operations and states)."""

    def __init__(self, record: Record, save: int, folder: str) -> None:
        self.record, self.save, self.folder = record, save, folder
        self.boots = {e["pid"]: e for e in record.history.of("boot")}
        self.saved: dict[int, list[tuple[float, int]]] = {}  # rank -> (t, file event index)
        for e in record.history.of("file"):
            if e.get("save") == save:
                self.saved.setdefault(e["rank"], []).append((e["t"], e["index"]))
        for events in self.saved.values():
            events.sort()
        self.next_own = _next_of_same_process(record)

    def crash(self, spec: StateSpec) -> PlacedCrash:
        t_cut = self._time(spec.cut)
        rank, process = self._process(spec.cut, t_cut)
        ops, first = self.record.ops, self.record.first
        if first < spec.cut <= len(ops):  # after an operation: its process's next one
            writer, t_next = _owner(ops[spec.cut - 1]), self.next_own[spec.cut - 1]
        else:
            writer, t_next = None, ops[spec.cut]["t"] if spec.cut < len(ops) else self.record.end
        return PlacedCrash(t_cut, rank, process, self._spec(spec, rank, t_cut), t_next, writer)

    def _time(self, cut: int) -> float:
        record = self.record
        if cut == len(record.ops):
            return record.end - 1e-6  # after the whole save: the job went on past it
        if cut == record.first:
            return record.ops[record.first]["t"] - 1e-6
        return record.ops[cut - 1]["t"]

    def _process(self, cut: int, t_cut: float) -> tuple[int, Event]:
        """The rank whose operation the crash follows (rank 0 before the save), and the
        boot event of its process."""
        if cut > self.record.first:
            boot = self.boots.get(_owner(self.record.ops[cut - 1]))
            if boot is not None:
                return boot["rank"], boot
        boot = min((e for e in self.boots.values() if e["t"] <= t_cut),
                   key=lambda e: e["rank"])
        return boot["rank"], boot

    def _spec(self, spec: StateSpec, rank: int, t_cut: float) -> Spec:
        """The chaos-run fault that leads to this state, as near as one spec says it (the
        rank's last file event in the save before the crash): `--per-point` replays it."""
        events = self.saved.get(rank, [])
        before = bisect.bisect_right(events, (t_cut, float("inf")))
        where = pairs(rank=rank, phase="checkpoint_save", save=self.save,
                      event=max(index for _, index in events[:before]) if before else None)
        if spec.mode == "kill":
            return Spec.make("kill", where)
        on = dir_pairs(self.folder)
        if spec.mode == "torn":
            return Spec.make("storage", pairs(mode="torn", keep=spec.keep), where, on)
        return Spec.make("storage", pairs(mode="lose_unsynced"), where, on)


