"""The standard kill battery: one command, every kill that matters, one table.

The fault steps are derived from the fault-free reference run, so the same
battery fits any training script: kills land mid-interval (between two
checkpoints), the in-save kills hit the second save of the rank that writes
checkpoints at its first write and its first rename, the file that save
writes last is torn (cut in half, in the rank, then its node dies), a power
loss lands right after that rename (one step after the save where it renames
nothing), and the preemption lands where a save is not due anyway. The power
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

import dataclasses
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass
from pathlib import Path

from torchchaos import env
from torchchaos.engine import run_scenario
from torchchaos.errors import CannotJudge, UsageError
from torchchaos.explore.keywords import PLACE
from torchchaos.faults.registry import get_kind
from torchchaos.harness import runner
from torchchaos.harness.reference import get_reference
from torchchaos.progress import Progress
from torchchaos.report import html_report
from torchchaos.report.model import Report
from torchchaos.rundir.history import Event, History
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import parse_fault_spec

BUNDLED_TARGET = env.package_dir("torchchaos.targets") / "ddp_lm.py"
BUNDLED_ARGS = ["--steps", "20", "--ckpt-every", "5"]


@dataclass
class Entry:
    name: str
    fault: str
    report: Report | None = None
    seed: int | None = None  # for the fault's seeded picks; None: the base scenario's
    start_from: str | None = None  # Scenario.start_from for this run
    error: str = ""  # why the run could not be judged, where it made no report


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
    entries.extend(_torn_last_write(history, writer, progress))
    entries.extend(_power_losses(history, writer, progress))
    entries.append(_preempt(mid))
    return entries


# -- the rows, named once: placed by plan_from, or outlined (`?`) by outline -----------

IN_SAVE = (("write", "mid-write"), ("rename", "right after a rename"))


def _kill(rank: int | str, step: int | str) -> Entry:
    return Entry(f"kill rank {rank} at step {step}", f"kill:rank={rank},step={step}")


def _node_kill(step: int | str) -> Entry:
    return Entry(f"kill node 0 at step {step}", f"kill:node=0,step={step}")


def _in_save_kill(writer: int | str, what: str, index: int | str) -> Entry:
    return Entry(f"kill rank {writer} {what} in its 2nd save",
                 f"kill:rank={writer},phase=checkpoint_save,save=2,event={index}")


def _torn(writer: int | str, index: int | str) -> Entry:
    return Entry(f"tear rank {writer}'s last write in its 2nd save",
                 f"storage:mode=torn,via=agent,rank={writer},phase=checkpoint_save,save=2,"
                 f"event={index}")


def _power_loss_at_rename(writer: int | str, index: int | str, folder: str) -> Entry:
    return Entry(f"power loss on rank {writer} after a rename in its 2nd save",
                 f"storage:mode=lose_unsynced,rank={writer},phase=checkpoint_save,"
                 f"save=2,event={index}{dir_param(folder)}")


def _power_loss_after(writer: int | str, step: int | str, folder: str) -> Entry:
    return Entry(f"power loss at step {step}, after rank {writer}'s 2nd save (which"
                 " renames nothing) ended",
                 f"storage:mode=lose_unsynced,rank={writer},step={step}{dir_param(folder)}")


def _preempt(step: int | str) -> Entry:
    return Entry(f"preempt rank 0 (SIGTERM) at step {step}",
                 f"kill:rank=0,step={step},signal=SIGTERM,grace=30")


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


def dir_param(folder: str) -> str:
    """`,dir=X` for a storage spec on the fault filesystem; nothing for the default,
    `ckpt`, so that the specs of jobs writing there read as they always did."""
    return "" if folder == "ckpt" else f",dir={folder}"


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


# -- running the rows ----------------------------------------------------------------------

def run_entries(entries: list[Entry], base: Scenario, out_dir: Path, cache_dir: Path,
                progress: Progress, title: str = "torchchaos runs", jobs: int = 1,
                numbers: list[int] | None = None, exitfirst: bool = False) -> list[Entry]:
    """One chaos run per entry (its fault on the base scenario), in out_dir/NN, `jobs`
    of them at a time; the index page out_dir/index.html is rewritten after each, so a
    cut-short sweep has one. `numbers` (1-based): only these entries (a shard's).
    `exitfirst`: stop once a run's verdict is not PASS (runs still going are cancelled),
    raising SweepStopped."""
    started = time.monotonic()
    finished: list[int] = []
    chosen = list(numbers) if numbers is not None else list(range(1, len(entries) + 1))
    began: dict[int, float] = {}
    costs: dict[str, list[float]] = {}  # row kind -> what its finished rows took

    def run(number: int) -> None:
        began[number] = time.monotonic()
        _run_entry(entries[number - 1], number, len(entries), base, out_dir, cache_dir,
                   progress)

    def after(number: int) -> None:
        finished.append(number)
        entry = entries[number - 1]
        costs.setdefault(row_kind(entry.fault), []).append(time.monotonic() - began[number])
        left = time_left(costs, [row_kind(entries[n - 1].fault) for n in chosen
                                 if n not in finished], jobs)
        verdict = entry.report.verdict.upper() if entry.report else "ERROR"
        progress(f"[{number}/{len(entries)}] {verdict:<5} "
                 f"{progress_bar(len(finished), len(chosen), time.monotonic() - started, left)}")
        write_index(entries, out_dir, title, sorted(finished))
        if exitfirst and verdict != "PASS":
            raise _NotPassed

    try:
        if jobs <= 1:
            for number in chosen:
                run(number)
                after(number)
        else:
            _in_parallel(run, after, chosen, jobs)
    except _NotPassed:  # every run still going was cancelled and reaped by now
        raise SweepStopped(sorted(finished), len(chosen)) from None
    except KeyboardInterrupt as exc:  # every run's processes are reaped by now
        raise SweepInterrupted(sorted(finished), len(chosen)) from exc
    return entries


class _NotPassed(Exception):
    """A run's verdict was not PASS, and the sweep stops at the first (-x)."""


class SweepStopped(Exception):
    """A sweep stopped at its first run that did not pass (`exitfirst`, -x): the runs
    that finished (1-based numbers), for the table and pages, and how many were planned."""

    def __init__(self, finished: list[int], planned: int) -> None:
        super().__init__(f"stopped at the first row that did not pass (-x): {len(finished)}"
                         f" of {planned} row(s) run")
        self.finished = finished
        self.planned = planned


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C or SIGTERM: the runs that finished (1-based numbers),
    for the partial table and pages, and how many were planned."""

    def __init__(self, finished: list[int], planned: int) -> None:
        super().__init__(f"interrupted after {len(finished)} of {planned} run(s)")
        self.finished = finished
        self.planned = planned


def _run_entry(entry: Entry, number: int, total: int, base: Scenario, out_dir: Path,
               cache_dir: Path, progress: Progress) -> None:
    progress(f"[{number}/{total}] {entry.name}: {entry.fault}")
    scenario = dataclasses.replace(base, faults=[parse_fault_spec(entry.fault)])
    if entry.seed is not None:
        scenario.seed = entry.seed
    if entry.start_from is not None:
        scenario.start_from = entry.start_from
    try:
        entry.report = run_scenario(scenario, out_dir / f"{number:02d}", cache_dir, progress)
    except (CannotJudge, UsageError) as exc:  # this run's fault only: the sweep goes on
        entry.error = str(exc)
        progress(f"could not judge {entry.name}: {exc}")


def _in_parallel(run: Callable[[int], None], after: Callable[[int], None],
                 numbers: list[int], jobs: int) -> None:
    """Runs on `jobs` threads (each run is its own process tree; the threads only wait).
    On Ctrl-C every run still going is cancelled, heals its faults and reaps its
    processes in its own thread before the interrupt goes on."""
    runner.reset_cancel()
    with ThreadPoolExecutor(jobs, thread_name_prefix="torchchaos-run") as pool:
        futures = {pool.submit(run, number): number for number in numbers}
        try:
            for future in as_completed(futures):
                future.result()
                after(futures[future])
        except BaseException:
            runner.cancel_all()
            for future in futures:
                future.cancel()
            wait(futures)
            raise


def progress_bar(done: int, total: int, elapsed: float, left: float, width: int = 20) -> str:
    """`[########------------] 40% 1m12s, about 1m48s left`."""
    filled = round(width * done / total) if total else width
    return (f"[{'#' * filled}{'-' * (width - filled)}] {100 * done // max(total, 1)}%"
            f" {_duration(elapsed)}, about {_duration(left)} left")


def row_kind(fault: str) -> str:
    """Rows that cost alike: the fault's kind, and whether it fires inside a save (its
    resume then meets a torn or lost checkpoint, and often fails and restarts)."""
    return fault.split(":", 1)[0] + (" in a save" if "phase=checkpoint_save" in fault else "")


def time_left(costs: dict[str, list[float]], remaining: list[str], jobs: int = 1) -> float:
    """Seconds the rows still to run should take, from what the finished rows took: each
    at the mean of its kind's finished rows, a kind none has finished yet at the dearest
    kind's mean (a battery runs its cheap rows, kills between saves, first)."""
    means = {kind: sum(took) / len(took) for kind, took in costs.items() if took}
    if not means:
        return 0.0
    dearest = max(means.values())
    return sum(means.get(kind, dearest) for kind in remaining) / max(jobs, 1)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def write_index(entries: list[Entry], out_dir: Path, title: str,
                numbers: list[int] | None = None, digits: int = 2) -> Path:
    """out_dir/index.html over the entries numbered `numbers` (default all), whose run
    folders are their numbers with `digits` digits."""
    chosen = numbers if numbers is not None else range(1, len(entries) + 1)
    return html_report.write_index(
        out_dir, [(f"{n:0{digits}d}", entries[n - 1].name, entries[n - 1].fault,
                   entries[n - 1].report) for n in chosen], title)


def table(entries: list[Entry]) -> str:
    """One row per run: its name, its verdict and the checks that failed, by the names
    `--check` takes (the one that names the cause first); under the rows, the checks
    judged, then each failing check's detail and each ERROR row's reason. Narrow
    enough for a terminal of 100 columns where the names are."""
    if not entries:
        return "(no run finished)"
    judged: list[str] = []
    for entry in entries:
        judged += [c for c in (entry.report.checks if entry.report else ()) if c not in judged]
    width = max(len("scenario"), *(len(e.name) for e in entries))
    header = f"{'scenario':<{width}}  verdict  failing checks"
    lines = [header, "-" * len(header)]
    for e in entries:
        verdict = e.report.verdict.upper() if e.report else "ERROR"
        failing = ", ".join(e.report.failing()) if e.report else ""
        lines.append(f"{e.name:<{width}}  {verdict:<7}  {failing}".rstrip())
    failing = [(e, n, e.report.checks[n]) for e in entries if e.report
               for n in e.report.failing()]  # per row, the cause first
    for entry, name, check in failing:
        lines.append(f"  {entry.name} / {name}: {check['detail']}")
    for entry in entries:  # every ERROR row says why
        reason = entry.report.reason if entry.report else entry.error
        if entry.report is None or entry.report.verdict == "error":
            lines.append(f"  {entry.name}: could not judge: {reason or 'no reason recorded'}")
    if judged:
        lines += textwrap.wrap(f"checks judged (each where it applies): {', '.join(judged)}",
                               100, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines)


def exit_code(entries: list[Entry]) -> int:
    """1 if any scenario found a bug; else 2 if any could not be judged; else 0."""
    if any(e.report and e.report.verdict == "fail" for e in entries):
        return 1
    return 2 if any(e.report is None or e.report.verdict == "error" for e in entries) else 0
