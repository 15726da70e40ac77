"""`torchchaos doctor`: is this script ready to be judged, and if not, why not.

A new user's first questions about their own script, answered from real runs
before any fault campaign: does it run under torchchaos at all (its working
directory is the run directory), is it seeded (two fault-free runs agree
bitwise), does it train (parameters that never change make every step look
alike), where does it save and how often, does it fsync what it saves, and
does it resume (one kill between two checkpoints, judged like any run).
Each answer is a `Diagnosis`: ok, warn (judging works, a check may fail) or
fail (no verdict can be trusted until it is fixed), with what to do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torchchaos.errors import CannotJudge
from torchchaos.explore import runs
from torchchaos.harness.reference import Unjudgeable, get_reference
from torchchaos.progress import Progress
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Spec

MARKS = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "----"}


@dataclass
class Diagnosis:
    topic: str  # runs, seeded, trains, saves, fsyncs, resumes
    status: str  # ok, warn, fail, skip
    detail: str


def examine(base: Scenario, cache_dir: Path, out_dir: Path, progress: Progress
            ) -> list[Diagnosis]:
    """Every finding, in the order a user fixes them: a later one needs the earlier."""
    try:
        reference = get_reference(dataclasses.replace(base, reference_runs=2), cache_dir,
                                  progress)
    except Unjudgeable as exc:
        return _refused(exc.topic, str(exc))
    except CannotJudge as exc:  # it fails, hangs or never steps without faults
        return _refused("runs", str(exc))
    history = reference.history()
    found = [Diagnosis("runs", "ok", f"{history.final_step()} steps on"
                                   f" {len(history.ranks())} rank(s) in"
                                   f" {reference.wall_seconds:.1f} s without faults"),
             Diagnosis("seeded", "ok", reference.detail),
             Diagnosis("trains", "ok", "its parameters change from step to step")]
    saves = _saves(history)
    found.append(saves)
    found.append(_fsyncs(history) if saves.status == "ok" else
                 Diagnosis("fsyncs", "skip", "no checkpoint save to look at"))
    found.append(_resumes(base, history, cache_dir, out_dir, progress)
                 if saves.status == "ok" else
                 Diagnosis("resumes", "fail", "no checkpoint to resume from: a restart starts"
                                            " over and loses every step"))
    return found


def _refused(topic: str, reason: str) -> list[Diagnosis]:
    """The reference runs' refusal (about `topic`: runs, seeded or trains) as the first
    finding that failed, after those that passed."""
    order = ["runs", "seeded", "trains"]
    said = {"runs": "it ran to its last step without faults",
            "seeded": "two fault-free runs agreed bitwise"}
    passed = [Diagnosis(t, "ok", said[t]) for t in order[:order.index(topic)]]
    rest = [Diagnosis(t, "skip", f"needs '{topic}' first")
            for t in [*order[order.index(topic) + 1:], "saves", "fsyncs", "resumes"]]
    return [*passed, Diagnosis(topic, "fail", reason), *rest]


def _writer_saves(history: History) -> list[int]:
    """The steps after which the checkpoint writer began a save (first launch)."""
    writer = history.checkpoint_writer()
    return sorted({e["after_step"] for e in history.of("save_begin")
                   if e["rank"] == writer and e.get("launch", 0) == 0})


def _saves(history: History) -> Diagnosis:
    steps = _writer_saves(history)
    if not steps:
        return Diagnosis("saves", "fail", "no checkpoint save under the run directory: it"
                                        " saves nowhere, or somewhere else (an absolute"
                                        " path); pass '{run_dir}/ckpt' as its folder")
    every = steps[1] - steps[0] if len(steps) > 1 else None
    folder = history.checkpoint_dir(1)
    where = (f"into {folder}/" if folder not in (None, ".") else
             "into the run directory itself" if folder == "." else "into several folders")
    how_often = f"every {every} steps" if every else f"once (after step {steps[0]})"
    writers = sorted({e["rank"] for e in history.of("save_begin") if e.get("launch", 0) == 0})
    by = f"rank {writers[0]}" if len(writers) == 1 else f"ranks {writers}"
    detail = f"{len(steps)} save(s), {how_often}, by {by}, {where}"
    if folder is not None:
        detail += f" (storage faults: dir={folder})"
    return Diagnosis("saves", "ok", detail)


def _fsyncs(history: History) -> Diagnosis:
    """Whether the writer's second save (or its first) makes its files and their
    folder entries durable: an fsync of a written file, and of the folder a file
    was renamed into."""
    writer = history.checkpoint_writer()
    save = 2 if len(_writer_saves(history)) > 1 else 1
    events = [e for e in history.of("file") if e["rank"] == writer and e.get("save") == save
              and e.get("launch", 0) == 0 and e.get("path")]
    written = {e["path"] for e in events if e["op"] in ("open", "write")}
    synced = {e["path"] for e in events if e["op"] == "fsync"}
    moved = {e["path"] for e in events if e["op"] in ("rename", "replace")}
    files = bool(written & synced)
    folders = not moved or all(str(Path(p).parent) in synced for p in moved)
    if files and folders:
        return Diagnosis("fsyncs", "ok", "it fsyncs the files it writes"
                                       + (" and the folder it renames them into"
                                          if moved else ""))
    missing = [what for what, ok in (("the files it writes", files),
                                     ("the folder after a rename", folders)) if not ok]
    return Diagnosis("fsyncs", "warn", f"it does not fsync {' nor '.join(missing)}: a power"
                                     " loss can drop a checkpoint it had finished"
                                     " (durable_checkpoints will fail under"
                                     " storage:mode=lose_unsynced)")


def _resumes(base: Scenario, history: History, cache_dir: Path, out_dir: Path,
             progress: Progress) -> Diagnosis:
    """One kill between the first two checkpoints' successors, judged in full."""
    saves = _writer_saves(history)
    final = history.final_step()
    step = min(saves[0] + max((saves[1] - saves[0]) // 2 if len(saves) > 1 else 1, 1),
               max(final - 1, 1))
    fault = Spec.make("kill", rank=0, step=step)
    progress(f"doctor: does it resume? {fault}")
    report, error = runs.run_row("does it resume?", [fault], base, out_dir / "resume",
                                 cache_dir, progress)
    if report is None:
        return Diagnosis("resumes", "fail", f"killed after step {step}: could not judge:"
                                          f" {error}")
    failed = [(name, report.checks[name]["detail"]) for name in report.failing()]
    if report.verdict == "pass":
        lost = report.lost_steps[0] if report.lost_steps else 0
        bitwise = report.checks.get("deterministic_resume", {}).get("detail", "")
        return Diagnosis("resumes", "ok", f"killed after step {step}, it resumed from step"
                                        f" {step - lost} ({lost} step(s) redone): {bitwise}")
    if failed:
        name, detail = failed[0]
        return Diagnosis("resumes", "fail", f"killed after step {step}: {name}: {detail}")
    return Diagnosis("resumes", "fail", f"killed after step {step}: could not judge:"
                                      f" {report.reason}")


def table(findings: list[Diagnosis]) -> str:
    width = max(len(f.topic) for f in findings)
    return "\n".join(f"{MARKS[f.status]:<4}  {f.topic:<{width}}  {f.detail}".rstrip()
                     for f in findings)


def exit_code(findings: list[Diagnosis]) -> int:
    """0: ready to be judged (warnings allowed); 1: something must be fixed first."""
    return 1 if any(f.status == "fail" for f in findings) else 0
