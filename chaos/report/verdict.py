"""From evidence to a report: run the checks, summarise the faults, refuse empty passes.

Every way of running a job ends here (one scenario, a multi-node gather, a crash
state judged from a recording), so each verdict is reached the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchchaos.faults.contract import ResolvedFault
from torchchaos.faults.registry import get_kind
from torchchaos.judge.checkers import CheckResult
from torchchaos.judge.checks_by_name import run_checks
from torchchaos.judge.evidence import Evidence
from torchchaos.progress import Progress
from torchchaos.report import html_report
from torchchaos.report.report_file import Report
from torchchaos.rundir.history import History


def fault_summary(faults: list[ResolvedFault], history: History) -> list[dict]:
    fired = {e["id"]: e for e in history.faults()}
    errors = {e["id"]: e["error"] for e in history.events
              if e["ev"].endswith("_error") and "id" in e}
    summary = []
    for f in faults:
        event = fired.get(f.id)
        kind = get_kind(f.kind)
        effect = kind.effect_event
        if effect is not None:  # it armed a hook or asked the harness: fired once that acted
            acted = next((e for e in history.of(effect) if e.get("id") == f.id), None)
            if acted is not None and acted.get("step") is None and event is not None:
                acted = {**acted, "step": event.get("step")}  # the request's step
            event = acted
        mark = next((e for e in history.events if e["ev"] in kind.marks
                     and e.get("id") == f.id), None)
        did = kind.said(mark) if mark is not None else ""
        summary.append({**f.to_dict(), "fired": event is not None,
                        "fired_step": event.get("step") if event else None,
                        **({"did": did} if did else {}),
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
    summary = fault_summary(faults, evidence.chaos)
    restarts = max(len(evidence.attempts) - 1, 0)  # false starts too: torchrun paid them
    report = Report.from_checks(results, faults=summary, restarts=restarts, **fields)
    reason = (_never_fired(summary) or _touched_nothing(faults, evidence.chaos)
              or _undecided_by_nondeterminism(results))
    if reason and report.verdict == "pass":  # a pass that tested nothing is no pass
        report.verdict, report.reason = "error", reason
    return report
