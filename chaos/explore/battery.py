"""The standard kill battery: one command, every kill that matters, one table.

The fault steps are derived from the fault-free reference run, so the same
battery fits any training script: kills land mid-interval (between two
checkpoints), the in-save kills hit the second save of the rank that writes
checkpoints at its first write and its first rename, that rank is stopped (SIGSTOP,
not killed) at the same write, so that only the job's own timeouts can end the wait
for it, the first save that deletes
an earlier save's file (a job keeping its N newest: save N + 1) is killed right
after that delete, the file the 2nd save writes last is torn (cut in half, in
the rank, then its node dies), a power loss lands right after that rename (one
step after the save where it renames nothing), and the preemption lands where a
save is not due anyway. The power
loss goes to the folder the save writes in (the fault filesystem is mounted
there). A row the job gives no place for (no rename, a save in several
top-level folders of the run directory, no FUSE) is left out, and a progress
line says which and why.

Before anything runs, the plan can be listed (`torchchaos battery --list`):
placed from the reference run where the cache holds it, else as an outline
whose placed numbers are `?`. Rows are picked by name with pytest's `-k`
expressions (`Keywords`), and a sweep may stop at its first row that does
not pass (`run_entries(exitfirst=True)`).
"""

from __future__ import annotations

from pathlib import Path

from torchchaos import env
from torchchaos.explore.crash import shapes
from torchchaos.explore.keywords import PLACE
from torchchaos.explore.rows import Entry
from torchchaos.faults.registry import get_kind
from torchchaos.faults.storage import dir_pairs
from torchchaos.harness.reference import get_reference
from torchchaos.progress import Progress
from torchchaos.rundir.history import Event, History
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Spec

BUNDLED_TARGET = env.package_dir("torchchaos.targets") / "ddp_lm.py"
BUNDLED_ARGS = ["--steps", "20", "--ckpt-every", "5"]


def plan(base: Scenario, cache_dir: Path, progress: Progress) -> list[Entry]:
    """Choose the battery's faults from what the reference run did (made first, where
    the cache does not hold it)."""
    return plan_from(get_reference(base, cache_dir, progress).history(), base, progress)


def plan_from(history: History, base: Scenario, progress: Progress) -> list[Entry]:
    """The battery's rows, placed from the reference run's history."""
    final = history.final_step()
    writer = history.checkpoint_writer()
    interval = history.save_interval() or max(final // 4, 1)
    mid = min(max(final // 2 + interval // 2, 1), max(final - 1, 1))
    if mid % interval == 0:  # land between two checkpoints, where work is at stake
        mid = max(mid - 1, 1)
    last_rank = base.world_size - 1
    entries = [_kill(rank, mid) for rank in sorted({0, last_rank})]
    entries.append(_node_kill(mid))
    entries.extend(_in_save_kills(history, writer, progress))
    entries.extend(_in_save_stop(history, writer, progress))
    entries.extend(_kill_after_first_delete(history, writer, progress))
    entries.extend(_torn_last_write(history, writer, progress))
    entries.extend(_power_losses(history, writer, progress))
    entries.append(_preempt(mid))
    return entries


# -- the rows, named once: placed by plan_from, or outlined (`?`) by outline -----------

IN_SAVE = (("write", "mid-write"), ("rename", "right after a rename"))


def _kill(rank: int | str, step: int | str) -> Entry:
    return Entry(f"kill rank {rank} at step {step}", Spec.make("kill", rank=rank, step=step))


def _node_kill(step: int | str) -> Entry:
    return Entry(f"kill node 0 at step {step}", Spec.make("kill", node=0, step=step))


def _in_save_kill(writer: int | str, what: str, index: int | str) -> Entry:
    return Entry(f"kill rank {writer} {what} in its 2nd save",
                 Spec.make("kill", rank=writer, phase="checkpoint_save", save=2, event=index))


def _in_save_stopped(writer: int | str, index: int | str) -> Entry:
    return Entry(f"stop rank {writer} mid-write in its 2nd save (SIGSTOP)",
                 Spec.make("hang", rank=writer, phase="checkpoint_save", save=2, event=index,
                         mode="stop"))


def _delete_kill(rank: int | str, save: int | str, index: int | str) -> Entry:
    return Entry(f"kill rank {rank} right after a delete in its {_nth(save)} save (the first"
                 " that deletes)",
                 Spec.make("kill", rank=rank, phase="checkpoint_save", save=save, event=index))


def _nth(number: int | str) -> str:
    if not isinstance(number, int):
        return str(number)
    last = number % 10 if number % 100 not in (11, 12, 13) else 0
    return f"{number}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(last, 'th') }"


def _torn(writer: int | str, index: int | str) -> Entry:
    return Entry(f"tear rank {writer}'s last write in its 2nd save",
                 Spec.make("storage", mode="torn", via="agent", rank=writer,
                         phase="checkpoint_save", save=2, event=index))


def _power_loss_at_rename(writer: int | str, index: int | str, folder: str) -> Entry:
    return Entry(f"power loss on rank {writer} after a rename in its 2nd save",
                 Spec.make("storage", mode="lose_unsynced", rank=writer,
                         phase="checkpoint_save", save=2, event=index).plus(dir_pairs(folder)))


def _power_loss_after(writer: int | str, step: int | str, folder: str) -> Entry:
    return Entry(f"power loss at step {step}, after rank {writer}'s 2nd save (which"
                 " renames nothing) ended",
                 Spec.make("storage", mode="lose_unsynced", rank=writer, step=step)
                 .plus(dir_pairs(folder)))


def _preempt(step: int | str) -> Entry:
    return Entry(f"preempt rank 0 (SIGTERM) at step {step}",
                 Spec.make("kill", rank=0, step=step, signal="SIGTERM", grace=30))


def outline(base: Scenario, progress: Progress) -> list[tuple[Entry, str]]:
    """The rows before the reference run places them (`--list` where it is not cached):
    what it places (the step between two checkpoints, the rank that writes checkpoints,
    a file event of its 2nd save, the folder the save writes in) is `?`. Each row comes
    with "" or the condition under which the job has it: a job gets the rows its save
    gives a place, and one of the two power losses. Runs nothing."""
    place = PLACE
    last_rank = base.world_size - 1
    rows = [(_kill(rank, place), "") for rank in sorted({0, last_rank})]
    rows.append((_node_kill(place), ""))
    rows += [(_in_save_kill(place, what, place), f"where the 2nd save makes a {op}")
             for op, what in IN_SAVE]
    rows.append((_in_save_stopped(place, place), "where the 2nd save makes a write"))
    rows.append((_delete_kill(place, place, place),
                 "where a save from the 2nd on deletes an earlier save's file"))
    rows.append((_torn(place, place), "where the 2nd save makes a write"))
    if reason := get_kind("storage").unavailable_reason():
        progress(f"no power loss in the battery: {reason}")
    else:
        where = " in one folder of the run directory"
        rows.append((_power_loss_at_rename(place, place, place),
                     f"where the 2nd save renames a file and writes{where}"))
        rows.append((_power_loss_after(place, place, place),
                     f"instead, where the 2nd save renames nothing and writes{where}"))
    rows.append((_preempt(place), ""))
    return rows


def cached_history(base: Scenario, cache_dir: Path, progress: Progress) -> History | None:
    """The reference run's history where the cache holds it whole (what `plan` would
    reuse), else None; runs nothing, and makes nothing in the cache."""
    from torchchaos.harness import reference

    entry = cache_dir / f"ref-{reference.cache_key(base)}"
    # the check get_reference makes before it reuses an entry (digests of every file)
    meta = reference._read_meta(entry, progress)
    if meta is None or meta["runs"] < base.reference_runs:
        return None
    return History.of_run(entry / "run-0")


def _save_events(history: History, writer: int, save: int) -> list[Event]:
    return [e for e in history.of("file") if e["rank"] == writer and e.get("save") == save]


def _in_save_kills(history: History, writer: int, progress: Progress) -> list[Entry]:
    """Kills inside the writer's 2nd save: mid-write (a torn file) and after the first
    rename (a published name), the two crash points that break most protocols. A row
    the save gives no place for is left out, with a progress line that says so."""
    events = _save_events(history, writer, 2)
    entries = []
    for op, what in IN_SAVE:
        index = next((e["index"] for e in events if e["op"] == op), None)
        if index is not None:
            entries.append(_in_save_kill(writer, what, index))
        else:
            progress(f"no 'kill {what}' row in the battery: rank {writer}'s 2nd save makes no"
                     f" {op} the agent saw" + ("" if events else " (it saw no save 2 at all)"))
    return entries


def _in_save_stop(history: History, writer: int, progress: Progress) -> list[Entry]:
    """The writer stopped (SIGSTOP) at its 2nd save's first write, not killed: torchrun
    sees a live worker, so only the job's own collective timeout or watchdog ends the
    peers' wait for it. A kill is reaped whatever the job's timeouts; this row is the
    one that finds a job without any (gloo's default waits 30 minutes, NCCL's 10)."""
    index = next((e["index"] for e in _save_events(history, writer, 2) if e["op"] == "write"),
                 None)
    if index is None:
        progress(f"no 'stop mid-write' row in the battery: rank {writer}'s 2nd save makes no"
                 " write the agent saw")
        return []
    return [_in_save_stopped(writer, index)]


def _kill_after_first_delete(history: History, writer: int,
                             progress: Progress) -> list[Entry]:
    """A kill right after the first file the first deleting save removes (the writer's,
    else any rank's): a job that keeps its N newest checkpoints deletes nothing before
    save N + 1, and a prune that runs before the new checkpoint is in place, or picks the
    wrong files, bites only there (`torchchaos.explore.crash.shapes`)."""
    save = shapes.first_save_that(history, "deletes")
    if save is None:
        return []
    removes = shapes.deletions(history, save)
    first = next((e for e in removes if e["rank"] == writer), removes[0])
    progress(f"save {save} is the first that deletes an earlier save's file: a row kills"
             f" rank {first['rank']} right after its first delete")
    return [_delete_kill(first["rank"], save, first["index"])]


def _torn_last_write(history: History, writer: int, progress: Progress) -> list[Entry]:
    """The newest file of the writer's 2nd save cut in half, then its node killed. An
    atomic protocol wrote it under a temporary name, so nothing published is harmed;
    one that overwrites in place has just lost its checkpoint. Torn in the rank
    (`via=agent`): no fault filesystem, so no folder to choose."""
    index = next((e["index"] for e in reversed(_save_events(history, writer, 2))
                  if e["op"] == "write"), None)
    if index is None:
        progress(f"no torn-write row in the battery: rank {writer}'s 2nd save makes no write"
                 " the agent saw")
        return []
    return [_torn(writer, index)]


def _power_losses(history: History, writer: int, progress: Progress) -> list[Entry]:
    """A power loss right after the first rename of the writer's 2nd save: the new name
    is published, and only fsyncs of the file and its folder make it (and the save
    before) survive. A save that renames nothing (written in place: nanoGPT, the DDP
    tutorial, HF Trainer) gets its power loss one step after it ended, before the next
    save: what it wrote survives only if it was fsynced. Needs the fault filesystem;
    left out, with a progress line that says why, where FUSE is missing and where the
    save does not write in one folder of the run directory to mount it on."""
    if reason := get_kind("storage").unavailable_reason():
        progress(f"no power loss in the battery: {reason}")
        return []
    events = _save_events(history, writer, 2)
    if not events:
        progress(f"no power loss in the battery: the agent saw no 2nd save of rank {writer}")
        return []
    folder = history.checkpoint_dir(2)
    if folder is None:
        where = sorted({Path(e["path"]).parts[0] for e in history.of("file")
                        if e.get("save") == 2 and e.get("path")})
        shown = ", ".join(where[:4]) + (", ..." if len(where) > 4 else "")
        progress(f"no power loss in the battery: the 2nd save writes in {shown}, not in one"
                 " folder of the run directory that the fault filesystem can be mounted over")
        return []
    index = next((e["index"] for e in events if e["op"] == "rename"), None)
    if index is not None:
        return [_power_loss_at_rename(writer, index, folder)]
    saved = max((e["after_step"] for e in history.of("save_begin")
                 if e.get("rank") == writer and e.get("save") == 2), default=None)
    if saved is None or saved + 1 > history.final_step():
        progress("no power loss in the battery: the 2nd save renames nothing, and no step"
                 " follows it to put a power loss after it")
        return []
    return [_power_loss_after(writer, saved + 1, folder)]
