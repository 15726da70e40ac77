"""The report: `report.json` (a stable contract) and the terminal verdict table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchchaos.judge import interval
from torchchaos.judge.checkers import CheckResult

MARK = {True: "PASS", False: "FAIL", None: "----"}
# Failing checks are told cause first: these name what went wrong (the fsync that was
# missing, the torn write, the state not restored, the undetected flip, the hang);
# `completes`, lost work, orphans and the exit follow from it. A check a plug-in adds
# sits between the two groups.
CAUSES = ("durable_checkpoints", "atomic_recovery", "deterministic_resume", "sdc_detected",
          "hang_detected", "no_split_brain")
CONSEQUENCES = ("completes", "bounded_lost_work", "no_orphans", "clean_exit")


@dataclass
class Report:
    verdict: str  # "pass" | "fail" | "error"
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    restarts: int = 0
    lost_steps: list[int | None] = field(default_factory=list)
    seconds_lost: list[float | None] = field(default_factory=list)
    mttr: list[float | None] = field(default_factory=list)
    ettr: float | None = None
    reason: str = ""  # why the verdict is "error"
    run_dir: str = ""
    reference_dir: str = ""
    wall_seconds: float = 0.0
    command: list[str] = field(default_factory=list)
    replay: str = ""  # the replay file: `torchchaos replay` runs this scenario again
    # Measured checkpoint cost and the Young/Daly interval (torchchaos.judge.interval.recommend);
    # None when no save finished
    checkpoint: dict[str, Any] | None = None
    # a crash state judged from a recording (torchchaos.explore.crash.sweep): which one, the save's
    # operations that led to it, and the recording run
    crash_state: str = ""
    operations: list[str] = field(default_factory=list)
    recording: str = ""

    @classmethod
    def from_checks(cls, checks: dict[str, CheckResult], **fields: Any) -> Report:
        verdict = "fail" if any(c.ok is False for c in checks.values()) else "pass"
        lost = checks.get("bounded_lost_work")
        metrics = {k: lost.data[k] for k in ("lost_steps", "seconds_lost", "mttr", "ettr")
                   if lost and k in lost.data}
        return cls(verdict=verdict, checks={n: c.to_dict() for n, c in checks.items()},
                   **metrics, **fields)

    def failing(self) -> list[str]:
        """The failing checks' names, the one that names the cause first."""
        def rank(name: str) -> int:
            if name in CAUSES:
                return CAUSES.index(name)
            if name in CONSEQUENCES:
                return len(CAUSES) + 1 + CONSEQUENCES.index(name)
            return len(CAUSES)
        return sorted((n for n, c in self.checks.items() if c.get("ok") is False), key=rank)

    def cause(self) -> str:
        """'check: detail' of the failing check that leads; "" where none failed."""
        failing = self.failing()
        return f"{failing[0]}: {self.checks[failing[0]]['detail']}" if failing else ""

    def exit_code(self) -> int:
        return {"pass": 0, "fail": 1}.get(self.verdict, 2)

    def write(self, out_dir: Path) -> Path:
        path = out_dir / "report.json"
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> Report:
        return cls(**json.loads(path.read_text()))

    def table(self) -> str:
        """The verdict table a person reads first."""
        width = max((len(n) for n in self.checks), default=10)
        lines = [f"{'check':<{width}}  verdict  detail", f"{'-' * width}  -------  ------"]
        for name, check in self.checks.items():
            lines.append(f"{name:<{width}}  {MARK[check['ok']]:<7}  {check['detail']}")
        fired = [f"{f['spec']} (fired at step {f['fired_step']}"
                 + (f": {f['did']})" if f.get("did") else ")") if f["fired"]
                 else f"{f['spec']} (never fired)" for f in self.faults]
        lines.append("")
        lines.append(f"faults: {', '.join(fired) or 'none'}; restarts: {self.restarts}")
        if self.checkpoint:
            lines.append(interval.summary(self.checkpoint))
        if self.reason:
            lines.append(f"error: {self.reason}")
        if self.failing():
            lines.append(f"cause: {self.cause()}")
        lines.append(f"verdict: {self.verdict.upper()}   run dir: {self.run_dir}")
        return "\n".join(lines)
