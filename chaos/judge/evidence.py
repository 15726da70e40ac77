"""What the checkers judge: the chaos run's history next to the reference's.

Built once after the runs, read by every checker; it derives the facts
several checkers need (recoveries, reference fingerprints by step) so each
checker stays a short pure function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from torchchaos.rundir.checkpoint_files import Finding
from torchchaos.rundir.history import Event, History, read_a_checkpoint


@dataclass
class Recovery:
    """One restart of the job's workers (an elastic restart or a relaunch)."""

    launch: int
    attempt: int
    started: float  # monotonic time of the first boot of this attempt
    failed_at: float  # when the failure happened (the fault, or the last event before)
    failed_step: int  # highest step completed before the failure
    restored: dict[int, int | None] = field(default_factory=dict)  # rank -> restored step
    first_step_at: float | None = None
    caught_up_at: float | None = None  # when failed_step was completed again
    # restarts before this one that died before any rank's first step (a port still
    # held, a rendezvous timeout): part of this recovery, which they delayed
    false_starts: list[tuple[int, int]] = field(default_factory=list)

    @property
    def restored_step(self) -> int | None:
        values = list(self.restored.values())
        if not values or any(v is None for v in values):
            return None
        return min(v for v in values if v is not None)

    @property
    def lost_steps(self) -> int | None:
        restored = self.restored_step
        return None if restored is None else max(self.failed_step - restored, 0)


@dataclass
class Evidence:
    chaos: History
    reference: History
    completed: bool
    deadline_hit: bool
    exit_codes: list[list[int | None]]
    wall_seconds: float
    reference_wall_seconds: float
    leftovers: list[int] = field(default_factory=list)
    leftover_mounts: list[str] = field(default_factory=list)
    leftover_network: list[str] = field(default_factory=list)
    reaped: list[int] = field(default_factory=list)
    reference_deterministic: bool | None = None
    reference_detail: str = ""
    max_lost_steps: int | None = None
    max_lost_seconds: float | None = None
    log_tail: str = ""  # the first error line of the last launch (its root cause)
    last_error: str = ""  # its last error line (how its last attempt died)
    stopped: bool = False  # ended on purpose some steps after a recovery (Scenario.stop_after)
    max_detect_steps: int | None = None  # sdc_detected's bound; None: the checkpoint interval
    chaos_dir: Path | None = None  # run directories, for the weights kept there
    reference_dir: Path | None = None
    hang: dict[str, Any] | None = None  # the harness's hang finding, if it tore the job down
    hang_timeout: float = 0.0  # the bound it used (seconds without progress)
    # every rank had ended its training, then the exit hung (the harness tore it down)
    exit_hang: dict[str, Any] | None = None
    # what the checkpoint folders held at the end: what their pointers name that is not
    # whole, and any file a resume read that is cut short (torchchaos.rundir.checkpoint_files)
    checkpoint_findings: list[Finding] = field(default_factory=list)

    def reference_steps(self) -> dict[tuple[int, int], dict[str, Any]]:
        return {(e["rank"], e["step"]): e for e in self.reference.steps()}

    def checkpoint_interval(self) -> int | None:
        """The most steps a failure can cost in the reference run's checkpoint schedule.

        Per rank: the largest distance from one save's state (`after_step`) to
        the step during which the next save finished (`last_step`), counting
        from step 0. For a synchronous save that is the checkpoint interval;
        an asynchronous one adds the steps it took to write and commit.
        """
        ends = {(e["pid"], e["save"]): e.get("last_step") for e in self.reference.of("save_end")}
        gaps = []
        for rank in self.reference.ranks():
            saves = sorted((e["after_step"], ends.get((e["pid"], e["save"])) or e["after_step"])
                           for e in self.reference.of("save_begin")
                           if e.get("rank") == rank and e.get("after_step"))
            starts = [0, *(after for after, _ in saves)]
            gaps.extend(last - start for start, (_, last) in zip(starts, saves))
        return max(gaps) if gaps else None

    def processes(self) -> dict[int, list[Event]]:
        """Each worker process's own events, in time order."""
        by_pid: dict[int, list[Event]] = {}
        for event in self.chaos.events:
            if "rank" in event and "pid" in event:
                by_pid.setdefault(event["pid"], []).append(event)
        return by_pid

    def steps_done_by(self, t: float) -> int:
        """The highest (aligned) step the job had completed before time `t`."""
        return max((e["step"] for e in self.chaos.steps()
                    if e["t"] < t and e.get("aligned", True)), default=0)

    def first_fault_time(self) -> float | None:
        faults = self.chaos.faults()
        return faults[0]["t"] if faults else None

    @cached_property
    def attempts(self) -> dict[tuple[int, int], list[Event]]:
        """The ranks' events of each (launch, attempt) of the job, in order."""
        attempts: dict[tuple[int, int], list[Event]] = {}
        for event in self.chaos.events:
            if "rank" in event and "launch" in event:
                attempts.setdefault((event["launch"], event["attempt"]), []).append(event)
        return dict(sorted(attempts.items()))

    def false_starts(self) -> set[tuple[int, int]]:
        """Restarts that died at start-up, before any rank read a checkpoint, followed by
        one in which ranks trained: the job got past them on its own (a port still held,
        a rendezvous timeout), so they are part of that next recovery rather than
        recoveries of their own.

        Only a restart that read nothing: one that loaded a checkpoint and died of it
        is a failed resume even if a later restart trains (it may have deleted what it
        could not load and fallen back). A restart that dies the same way until the
        job gives up has no successor that trains: it stays a failed recovery."""
        keys = list(self.attempts)
        trained = [any(e["ev"] == "step" for e in self.attempts[key]) for key in keys]
        return {key for i, key in enumerate(keys[1:], start=1)
                if _died_before_reading(self.attempts[key]) and any(trained[i + 1:])}

    @cached_property
    def recoveries(self) -> list[Recovery]:
        """Every attempt after the first, with where it failed and what it restored."""
        attempts = self.attempts
        skipped = self.false_starts()
        keys = [key for key in attempts if key not in skipped]
        result = []
        for previous, key in zip(keys, keys[1:]):
            events = attempts[key]
            started = min(e["t"] for e in events)
            before = [e for e in self.chaos.events if e["t"] < started]
            faults = [e for e in before if e["ev"] == "fault"
                      and (e["launch"], e["attempt"]) == previous]
            failed_at = faults[-1]["t"] if faults else max(e["t"] for e in attempts[previous])
            recovery = Recovery(key[0], key[1], started, failed_at, self.steps_done_by(started),
                                false_starts=[k for k in skipped if previous < k < key])
            for e in events:
                if e["ev"] == "restore":
                    recovery.restored[e["rank"]] = e["restored"]
            steps = [e for e in events if e["ev"] == "step"]
            if steps:
                recovery.first_step_at = steps[0]["t"]
                again = [e["t"] for e in steps if e.get("step") == recovery.failed_step]
                recovery.caught_up_at = min(again) if again else None
            result.append(recovery)
        return result


def _died_before_reading(events: list[Event]) -> bool:
    """No rank of this attempt restored, trained, loaded a file or raised after a load."""
    return not read_a_checkpoint(events) and not any(e["ev"] in ("restore", "step")
                                                     for e in events)
