"""A finished job and its reference run, as the evidence the judge reads.

One builder for what a single-machine run hands the judge: `engine.run_scenario`
(one chaos run) and the crash-state sweep (a recovery judged on a history
spliced from the recording) build it here from the same parts, so a field added
to `Evidence` is filled in one place. A multi-machine run's evidence merges
every node's record (`harness.multinode`).
"""

from __future__ import annotations

from pathlib import Path

from torchchaos.harness.reference import Reference
from torchchaos.harness.runner import JobOutcome
from torchchaos.judge.evidence import Evidence
from torchchaos.rundir import checkpoint_files
from torchchaos.rundir.history import History
from torchchaos.rundir.layout import CHAOS_DIR
from torchchaos.scenario.model import Scenario


def evidence_from(chaos: History, outcome: JobOutcome, reference: Reference,
                  scenario: Scenario, chaos_dir: Path, hang_timeout: float,
                  findings: list[checkpoint_files.Finding] | None = None) -> Evidence:
    """The evidence of one job: `chaos` is its history (a crash state's, spliced), the
    rest what its runner and its reference run say, the bounds the scenario's.
    `findings`: what its checkpoint folders held, where it was read before they went
    (a crash state's recovery); else read from `chaos_dir` now."""
    if findings is None:  # only where a fault fired: a fault-free end has nothing to explain
        findings = (checkpoint_findings(chaos, chaos_dir)
                    if chaos.faults() and chaos_dir.is_dir() else [])
    return Evidence(
        chaos=chaos, reference=reference.history(), completed=outcome.completed,
        deadline_hit=outcome.deadline_hit, exit_codes=outcome.exit_codes,
        wall_seconds=outcome.wall_seconds, reference_wall_seconds=reference.wall_seconds,
        leftovers=outcome.leftovers, leftover_mounts=outcome.leftover_mounts,
        leftover_network=outcome.leftover_network, reaped=outcome.reaped,
        stopped=outcome.stopped, reference_deterministic=reference.deterministic,
        reference_detail=reference.detail, max_lost_steps=scenario.max_lost_steps,
        max_lost_seconds=scenario.max_lost_seconds, log_tail=outcome.log_tail(),
        last_error=outcome.last_error(), max_detect_steps=scenario.max_detect_steps,
        chaos_dir=chaos_dir, reference_dir=reference.run_dir, hang=outcome.hang,
        exit_hang=outcome.exit_hang, hang_timeout=hang_timeout,
        checkpoint_findings=findings)


def checkpoint_findings(history: History, run_dir: Path, roots: list[str] | None = None,
                        contents: bool = True) -> list[checkpoint_files.Finding]:
    """What the folders `roots` (default: every top-level folder the job's file events
    name) hold at the end, and what the job loaded (`torchchaos.rundir.checkpoint_files`;
    `contents`: read from their bytes, else by names and sizes alone)."""
    if roots is None:
        roots = sorted({Path(e["path"]).parts[0] for e in history.of("file")
                        if e.get("path") and Path(e["path"]).parts[0] != CHAOS_DIR})
    read = sorted({e["path"] for e in history.of("load") if e.get("path")})
    return checkpoint_files.inspect(run_dir, roots, read, contents)
