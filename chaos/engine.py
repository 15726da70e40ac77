"""Run a scenario end to end: reference, chaos run, checks, report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos import html_report, interval, scenario_file, schedule
from chaos.checkers import CheckResult, run_checks
from chaos.errors import UsageError
from chaos.evidence import Evidence
from chaos.hangwatch import default_timeout
from chaos.history import History
from chaos.reference import get_reference
from chaos.registry import get_kind
from chaos.report import Report
from chaos.runner import Job, Progress, torchrun_command
from chaos.scenario import Scenario
from chaos.schedule import ResolvedFault


def prepare_out_dir(out_dir: Path) -> None:
    """Create the output directory; never write into one that already holds data."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UsageError(f"output directory {out_dir} already exists and is not empty;"
                         " choose a new one")
    out_dir.mkdir(parents=True, exist_ok=True)


def _fault_summary(faults: list[ResolvedFault], history: History) -> list[dict]:
    fired = {e["id"]: e for e in history.faults()}
    errors = {e["id"]: e["error"] for e in history.events
              if e["ev"].endswith("_error") and "id" in e}
    summary = []
    for f in faults:
        event = fired.get(f.id)
        effect = get_kind(f.kind).effect_event
        if effect is not None:  # it armed a hook: fired once the hook acted
            event = next((e for e in history.of(effect) if e.get("id") == f.id), None)
        summary.append({**f.to_dict(), "fired": event is not None,
                        "fired_step": event.get("step") if event else None,
                        **({"error": errors[f.id]} if f.id in errors else {})})
    return summary


def _never_fired(summary: list[dict]) -> str:
    missing = [f for f in summary if not f["fired"] and f["trigger"]["p"] is None]
    if not missing:
        return ""
    why = [f"{f['spec']}: {f['error']}" for f in missing if "error" in f]
    if why:
        return f"fault(s) could not act: {'; '.join(why)}"
    return (f"fault(s) never fired: {', '.join(f['spec'] for f in missing)} (the trigger was"
            " never reached; the target's checkpoint I/O, step count or collectives may differ"
            " from what the spec assumes)")


def _touched_nothing(faults: list[ResolvedFault], history: History) -> str:
    """A storage fault over a folder the job never wrote nor read, or bit rot that found
    no file to rot: the run tested nothing, so its pass is no pass."""
    paths = [Path(e["path"]) for e in history.of("file", "load") if e.get("path")]
    for fault in faults:
        if fault.kind != "storage" or fault.params.get("via") == "agent":
            continue
        folder = Path(str(fault.params.get("dir", "ckpt")))
        if not any(folder == Path(".") or folder in p.parents for p in paths):
            seen = sorted({p.parts[0] for p in paths if not p.is_absolute()})
            where = f" (it uses {', '.join(seen)}: pass dir=...)" if seen else ""
            return (f"{fault.spec} touched nothing: the job wrote and read no file under"
                    f" {folder}/{where}")
    rot = [e for e in history.of("fs_bitrot") if not e.get("file")]
    if rot:
        return ("bit rot found no durable checkpoint file to corrupt (does the job fsync"
                " its checkpoints?)")
    return ""


def _undecided_by_nondeterminism(checks: dict[str, CheckResult]) -> str:
    for check in checks.values():
        if check.data.get("nondeterministic"):
            return check.detail
    return ""


def write_html(report: Report, out_dir: Path, evidence: Evidence, say: Progress) -> None:
    """report.html and timeline.svg; a bug in drawing them must not cost the verdict."""
    try:
        html_report.write_run(report, out_dir, evidence.chaos, evidence.recoveries)
    except Exception as exc:  # noqa: BLE001 - report.json is written; say what went wrong
        say(f"could not write {html_report.HTML_FILE}: {type(exc).__name__}: {exc}")


def judge(evidence: Evidence, faults: list[ResolvedFault], checks: list[str] | None,
          **fields: Any) -> Report:
    """Run the checks over the evidence and come to a verdict; `fields` go into the report."""
    results = run_checks(evidence, checks)
    summary = _fault_summary(faults, evidence.chaos)
    report = Report.from_checks(results, faults=summary, restarts=len(evidence.recoveries),
                                **fields)
    reason = (_never_fired(summary) or _touched_nothing(faults, evidence.chaos)
              or _undecided_by_nondeterminism(results))
    if reason and report.verdict == "pass":  # a pass that tested nothing is no pass
        report.verdict, report.reason = "error", reason
    return report


def run_scenario(scenario: Scenario, out_dir: Path, cache_dir: Path,
                 progress: Progress | None = None) -> Report:
    say = progress or (lambda _msg: None)
    scenario.validate()
    faults = schedule.resolve(scenario.faults, scenario.seed, scenario.nproc, scenario.nodes)
    prepare_out_dir(out_dir)
    # Written first, so that even a run cut short can be replayed; again at the end with
    # the verdict, so that a replay says whether it reproduced.
    replay = scenario_file.for_run(scenario, faults).save(out_dir / scenario_file.REPLAY_FILE)
    reference = get_reference(scenario, cache_dir, say)
    say(f"chaos run with {len(faults)} fault(s): {', '.join(f.spec for f in faults) or 'none'}")
    chaos_dir = out_dir / "chaos"
    chaos_dir.mkdir()
    reference_history = reference.history()
    hang_timeout = scenario.hang_timeout or default_timeout(reference_history)
    start_from = Path(scenario.start_from) if scenario.start_from else None
    outcome = Job(scenario, chaos_dir, faults, reference.run_dir, say, hang_timeout,
                  start_from).run()
    say(f"chaos run done in {outcome.wall_seconds:.1f} s ({outcome.launches} launch(es))")
    chaos_history = History.of_run(chaos_dir)
    evidence = Evidence(
        chaos=chaos_history, reference=reference_history, completed=outcome.completed,
        deadline_hit=outcome.deadline_hit, exit_codes=outcome.exit_codes,
        wall_seconds=outcome.wall_seconds, reference_wall_seconds=reference.wall_seconds,
        leftovers=outcome.leftovers, leftover_mounts=outcome.leftover_mounts,
        leftover_network=outcome.leftover_network,
        reaped=outcome.reaped, stopped=outcome.stopped,
        reference_deterministic=reference.deterministic, reference_detail=reference.detail,
        max_lost_steps=scenario.max_lost_steps, max_lost_seconds=scenario.max_lost_seconds,
        log_tail=outcome.log_tail(), max_detect_steps=scenario.max_detect_steps,
        chaos_dir=chaos_dir, reference_dir=reference.run_dir, hang=outcome.hang,
        hang_timeout=hang_timeout,
    )
    report = judge(
        evidence, faults, scenario.checks, run_dir=str(chaos_dir),
        reference_dir=str(reference.run_dir), wall_seconds=outcome.wall_seconds,
        command=torchrun_command(scenario, 0, "RUN_ID", 0, chaos_dir),  # node 0's, shown
        replay=str(replay),
        checkpoint=interval.advice(evidence, scenario.mtbf_hours),
    )
    scenario_file.for_run(scenario, faults, report).save(replay)
    report.write(out_dir)
    write_html(report, out_dir, evidence, say)
    return report
