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
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass
from pathlib import Path

from torchchaos import env
from torchchaos.engine import run_scenario
from torchchaos.errors import CannotJudge, UsageError
from torchchaos.faults.registry import get_kind
from torchchaos.harness import runner
from torchchaos.harness.reference import get_reference
from torchchaos.harness.runner import Progress
from torchchaos.report import html_report
from torchchaos.report.model import MARK, Report
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
    """Choose the battery's faults from what the reference run did."""
    history = get_reference(base, cache_dir, progress).history()
    final = history.final_step()
    writer = history.checkpoint_writer()
    interval = history.save_interval() or max(final // 4, 1)
    mid = min(max(final // 2 + interval // 2, 1), max(final - 1, 1))
    if mid % interval == 0:  # land between two checkpoints, where work is at stake
        mid = max(mid - 1, 1)
    last_rank = base.world_size - 1
    entries = [Entry(f"kill rank {rank} at step {mid}", f"kill:rank={rank},step={mid}")
               for rank in sorted({0, last_rank})]
    entries.append(Entry(f"kill node 0 at step {mid}", f"kill:node=0,step={mid}"))
    entries.extend(_in_save_kills(history, writer, progress))
    entries.extend(_torn_last_write(history, writer, progress))
    entries.extend(_power_losses(history, writer, progress))
    entries.append(Entry(f"preempt rank 0 (SIGTERM) at step {mid}",
                         f"kill:rank=0,step={mid},signal=SIGTERM,grace=30"))
    return entries


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
    for op, what in (("write", "mid-write"), ("rename", "right after a rename")):
        index = next((e["index"] for e in events if e["op"] == op), None)
        if index is not None:
            entries.append(Entry(f"kill rank {writer} {what} in its 2nd save",
                                 f"kill:rank={writer},phase=checkpoint_save,save=2,"
                                 f"event={index}"))
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
    return [Entry(f"tear rank {writer}'s last write in its 2nd save",
                  f"storage:mode=torn,via=agent,rank={writer},phase=checkpoint_save,save=2,"
                  f"event={index}")]


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
        return [Entry(f"power loss on rank {writer} after a rename in its 2nd save",
                      f"storage:mode=lose_unsynced,rank={writer},phase=checkpoint_save,"
                      f"save=2,event={index}{dir_param(folder)}")]
    saved = max((e["after_step"] for e in history.of("save_begin")
                 if e.get("rank") == writer and e.get("save") == 2), default=None)
    if saved is None or saved + 1 > history.final_step():
        progress("no power loss in the battery: the 2nd save renames nothing, and no step"
                 " follows it to put a power loss after it")
        return []
    return [Entry(f"power loss at step {saved + 1}, after rank {writer}'s 2nd save (which"
                  " renames nothing) ended",
                  f"storage:mode=lose_unsynced,rank={writer},step={saved + 1}"
                  f"{dir_param(folder)}")]


def run_entries(entries: list[Entry], base: Scenario, out_dir: Path, cache_dir: Path,
                progress: Progress, title: str = "torchchaos runs", jobs: int = 1,
                numbers: list[int] | None = None) -> list[Entry]:
    """One chaos run per entry (its fault on the base scenario), in out_dir/NN, `jobs`
    of them at a time; the index page out_dir/index.html is rewritten after each, so a
    cut-short sweep has one. `numbers` (1-based): only these entries (a shard's)."""
    started = time.monotonic()
    finished: list[int] = []
    chosen = list(numbers) if numbers is not None else list(range(1, len(entries) + 1))

    def run(number: int) -> None:
        _run_entry(entries[number - 1], number, len(entries), base, out_dir, cache_dir,
                   progress)

    def after(number: int) -> None:
        finished.append(number)
        entry = entries[number - 1]
        verdict = entry.report.verdict.upper() if entry.report else "ERROR"
        progress(f"[{number}/{len(entries)}] {verdict:<5} "
                 f"{progress_bar(len(finished), len(chosen), time.monotonic() - started)}")
        write_index(entries, out_dir, title, sorted(finished))

    try:
        if jobs <= 1:
            for number in chosen:
                run(number)
                after(number)
        else:
            _in_parallel(run, after, chosen, jobs)
    except KeyboardInterrupt as exc:  # every run's processes are reaped by now
        raise SweepInterrupted(sorted(finished), len(chosen)) from exc
    return entries


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


def progress_bar(done: int, total: int, elapsed: float, width: int = 20) -> str:
    """`[########------------] 40% 1m12s, about 1m48s left` (the estimate assumes the
    runs still to come take as long as those done)."""
    filled = round(width * done / total) if total else width
    left = elapsed / done * (total - done) if done else 0.0
    return (f"[{'#' * filled}{'-' * (width - filled)}] {100 * done // max(total, 1)}%"
            f" {_duration(elapsed)}, about {_duration(left)} left")


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
    if not entries:
        return "(no run finished)"
    checks = next((list(e.report.checks) for e in entries if e.report), [])
    short = {"completes": "completes", "atomic_recovery": "atomic", "bounded_lost_work":
             "lost_work", "deterministic_resume": "bitwise", "durable_checkpoints": "durable",
             "no_orphans": "orphans", "sdc_detected": "sdc", "hang_detected": "hang",
             "no_split_brain": "split", "clean_exit": "exit"}
    width = max(len(e.name) for e in entries)
    header = f"{'scenario':<{width}}  " + "  ".join(f"{short.get(c, c):<9}" for c in checks)
    lines = [header + "  verdict", "-" * (len(header) + 9)]
    for e in entries:
        if e.report is None:
            lines.append(f"{e.name:<{width}}  " + "could not judge".ljust(11 * len(checks))
                         + "ERROR")
            continue
        marks = "  ".join(f"{MARK[e.report.checks[c]['ok']]:<9}" for c in checks)
        lines.append(f"{e.name:<{width}}  {marks}  {e.report.verdict.upper()}")
    failing = [(e, n, e.report.checks[n]) for e in entries if e.report
               for n in e.report.failing()]  # per row, the cause first
    for entry, name, check in failing:
        lines.append(f"  {entry.name} / {name}: {check['detail']}")
    for entry in entries:  # every ERROR row says why
        reason = entry.report.reason if entry.report else entry.error
        if entry.report is None or entry.report.verdict == "error":
            lines.append(f"  {entry.name}: could not judge: {reason or 'no reason recorded'}")
    return "\n".join(lines)


def exit_code(entries: list[Entry]) -> int:
    """1 if any scenario found a bug; else 2 if any could not be judged; else 0."""
    if any(e.report and e.report.verdict == "fail" for e in entries):
        return 1
    return 2 if any(e.report is None or e.report.verdict == "error" for e in entries) else 0
