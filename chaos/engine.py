"""Run a scenario end to end: reference, chaos run, checks, report."""

from __future__ import annotations

from pathlib import Path

from torchchaos.errors import UsageError
from torchchaos.harness import reachable
from torchchaos.harness.evidence_from import evidence_from
from torchchaos.harness.hangwatch import default_timeout
from torchchaos.harness.reference import check_cache_dir, get_reference
from torchchaos.harness.runner import Job, torchrun_command
from torchchaos.judge import interval
from torchchaos.judge.evidence import Evidence
from torchchaos.progress import Progress
from torchchaos.report.report_file import Report
from torchchaos.report.verdict import fault_summary, judge, write_html
from torchchaos.rundir.folders import unwritable
from torchchaos.rundir.history import History
from torchchaos.scenario import files as scenario_file
from torchchaos.scenario import schedule
from torchchaos.scenario.model import Scenario


def check_out_dir(out_dir: Path) -> None:
    """Refuse an output directory that holds data or cannot be written, before anything
    is started or written: found later, a run would be lost half way."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"output directory {out_dir} is a file, not a folder; choose a"
                         " new folder (--out)")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"output directory {out_dir} already exists and is not empty;"
                         " choose a new one")
    why = unwritable(out_dir)
    if why:
        raise UsageError(f"output directory {out_dir}: {why}; choose another (--out)")


def prepare_out_dir(out_dir: Path) -> None:
    """Create the output directory; never write into one that already holds data."""
    check_out_dir(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # the filesystem changed since the check
        raise UsageError(f"output directory {out_dir}: {exc.strerror or exc};"
                         " choose another (--out)") from None


def interrupted(out_dir: Path, chaos_dir: Path, faults: list[schedule.ResolvedFault],
                exc: BaseException) -> Report:
    """OUT/report.json of a run cut short (its processes already reaped): verdict
    "error", how far it got, so a CI job killed at its time limit leaves a report."""
    history = History.of_run(chaos_dir)
    how = f" ({exc})" if str(exc) else ""
    report = Report(verdict="error", run_dir=str(chaos_dir),
                    faults=fault_summary(faults, history),
                    reason=f"interrupted{how} at step {history.final_step()}, before a"
                           " verdict: nothing was judged")
    report.write(out_dir)
    return report


def run_scenario(scenario: Scenario, out_dir: Path, cache_dir: Path,
                 progress: Progress | None = None) -> Report:
    say = progress or (lambda _msg: None)
    scenario.validate()
    faults = schedule.resolve(scenario.faults, scenario.seed, scenario.nproc, scenario.nodes)
    check_cache_dir(cache_dir)  # before replay.yaml: a refused run leaves --out unused
    made = not out_dir.exists()
    prepare_out_dir(out_dir)
    # Written first, so that even a run cut short can be replayed; again at the end with
    # the verdict, so that a replay says whether it reproduced.
    replay = scenario_file.for_run(scenario, faults).save(out_dir / scenario_file.REPLAY_FILE)
    reference = get_reference(scenario, cache_dir, say)
    never = reachable.unreachable(faults, reference.history(), scenario.nproc)
    if never:  # refused before the run with faults: --out is left as it was found
        replay.unlink()
        if made:
            out_dir.rmdir()
        raise UsageError(never)
    say(f"chaos run with {len(faults)} fault(s): {', '.join(f.spec for f in faults) or 'none'}")
    chaos_dir = out_dir / "chaos"
    chaos_dir.mkdir()
    reference_history = reference.history()
    hang_timeout = scenario.hang_timeout or default_timeout(reference_history)
    start_from = Path(scenario.start_from) if scenario.start_from else None
    try:
        outcome = Job(scenario, chaos_dir, faults, reference.run_dir, say, hang_timeout,
                      start_from).run()
    except KeyboardInterrupt as exc:  # Ctrl-C, or a CI job's timeout (SIGTERM)
        interrupted(out_dir, chaos_dir, faults, exc)
        raise
    say(f"chaos run done in {outcome.wall_seconds:.1f} s ({outcome.launches} launch(es))")
    chaos_history = History.of_run(chaos_dir)
    evidence = evidence_from(chaos_history, outcome, reference, scenario, chaos_dir,
                             hang_timeout)
    report = judge(
        evidence, faults, scenario.checks, run_dir=str(chaos_dir),
        reference_dir=str(reference.run_dir), wall_seconds=outcome.wall_seconds,
        command=torchrun_command(scenario, 0, "RUN_ID", 0, chaos_dir),  # node 0's, shown
        replay=str(replay),
        checkpoint=interval.advice(evidence, scenario.mtbf_hours),
    )
    publish(report, out_dir, evidence, scenario, faults, say)
    return report


def publish(report: Report, out_dir: Path, evidence: Evidence, scenario: Scenario,
            faults: list[schedule.ResolvedFault], say: Progress,
            only_failures: bool = False) -> None:
    """What a judged run leaves in its folder: its replay file with the verdict (what
    `torchchaos replay` runs), report.json and the HTML page. `only_failures`: the
    replay file and the page only for a run that did not pass (a sweep of thousands of
    crash states keeps the passes to report.json)."""
    shown = report.verdict != "pass" or not only_failures
    if shown:
        report.replay = str(scenario_file.for_run(scenario, faults, report).save(
            out_dir / scenario_file.REPLAY_FILE))
    report.write(out_dir)
    if shown:
        write_html(report, out_dir, evidence, say)
