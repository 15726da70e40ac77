"""Running a sweep's rows and ending the sweep: one module for every sweep.

Every sweep (the battery, crash points, a bit-flip campaign, a suite) plans its
rows (`rows.Entry`) its own way, then hands them here: each row's fault runs on
the sweep's base scenario in OUT/NN (`run_row`, which the search's schedules and
the doctor's resume run through too), the index page is rewritten after each row
(a cut-short sweep has one), `-x` stops at the first row that did not pass,
Ctrl-C reaps every run still going. Crash states are judged from one recording
(`crash/sweep.py`) and end here too: `finish` writes what every sweep ends with
(the table, the index page, JUnit XML, a campaign's campaign.json) and gives its
exit status, for a whole sweep, a shard's or a merge's.
"""

from __future__ import annotations

import dataclasses
import textwrap
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from pathlib import Path

from torchchaos.engine import run_scenario
from torchchaos.errors import CannotJudge, UsageError
from torchchaos.explore import campaign
from torchchaos.explore.rows import Entry
from torchchaos.explore.shards import folder_digits
from torchchaos.harness import runner
from torchchaos.progress import Progress
from torchchaos.report import html_report, junit
from torchchaos.report.report_file import Report
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Spec

# the page title of each sweep
TITLES = {"battery": "torchchaos battery", "crashpoints": "torchchaos crash points",
          "crashstates": "torchchaos crash states", "campaign": "torchchaos bit-flip campaign"}


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
    entry.report, entry.error = run_row(entry.name, [entry.fault], base,
                                        out_dir / f"{number:02d}", cache_dir, progress,
                                        seed=entry.seed, start_from=entry.start_from)


def run_row(name: str, faults: Sequence[Spec], base: Scenario, run_dir: Path,
            cache_dir: Path, progress: Progress | None = None, seed: int | None = None,
            start_from: str | None = None) -> tuple[Report | None, str]:
    """The one place where planned faults become a chaos run (a sweep's row, a searched
    schedule, the doctor's resume): the base scenario with these faults (and this seed
    and start, where given), run in run_dir. Its report, or None and why it could not be
    judged: a row the engine cannot judge, or whose faults this job cannot have, is
    that row's error only, and the sweep goes on."""
    scenario = dataclasses.replace(base, faults=[spec.parse() for spec in faults])
    if seed is not None:
        scenario.seed = seed
    if start_from is not None:
        scenario.start_from = start_from
    try:
        return run_scenario(scenario, run_dir, cache_dir, progress), ""
    except (CannotJudge, UsageError) as exc:
        if progress is not None:
            progress(f"could not judge {name}: {exc}")
        return None, str(exc)


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


def row_kind(fault: Spec) -> str:
    """Rows that cost alike: the fault's kind, and whether it fires inside a save (its
    resume then meets a torn or lost checkpoint, and often fails and restarts)."""
    return fault.kind + (" in a save" if fault.get("phase") == "checkpoint_save" else "")


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
        out_dir, [(f"{n:0{digits}d}", entries[n - 1].name, str(entries[n - 1].fault),
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


def finish(command: str, entries: list[Entry], numbers: list[int], out: Path,
                  junitxml: Path | None, summary: str = "",
                  rows: list[Entry] | None = None,
                  fail_on: frozenset[str] = frozenset()) -> int:
    """What every way of running a sweep ends with: the table (of `rows` where given:
    crash states in groups), the pages, campaign.json, JUnit XML, the exit status; over
    the runs `numbers` (a shard's, or all)."""
    chosen = [entries[n - 1] for n in numbers]
    digits = folder_digits(command)
    write_index(entries, out, TITLES[command], numbers, digits)
    if junitxml is not None:
        junit.write(junitxml, TITLES[command], [
            (f"{n:0{digits}d}", entries[n - 1].name, str(entries[n - 1].fault),
             entries[n - 1].report, entries[n - 1].error) for n in numbers])
    if command != "campaign":
        return _print_table(chosen if rows is None else rows, out, summary)
    print(campaign.table(entries, numbers))
    print(f"runs: {out} (details: {campaign.write(entries, out, numbers)};"
          f" pages: {out / 'index.html'})")
    return campaign.exit_code(chosen, fail_on)


def _print_table(entries: list[Entry], out: Path, summary: str = "") -> int:
    print(table(entries))
    if summary:
        print(summary)
    print(f"runs: {out} (pages: {out / 'index.html'})")
    return exit_code(entries)
