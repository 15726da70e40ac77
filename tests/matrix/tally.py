"""The verdict matrix: what each run of the independent targets should have said,
what the harness said, and per check the false alarms, misses and errors.

- false alarm: a check False on a correct variant;
- miss: the check a bug should fail is True on that bug's run;
- wrong cause: it failed, but its detail lacks the words that name the cause;
- error: the run could not be judged (no report, verdict "error", or the check
  that should fail is not applicable).

A `MatrixPlugin` registered with pytest prints the table at the end of the
session and writes it, with every incident, to `verdict-matrix.json` in the
session's temporary folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

WHOLE_RUN = "(whole run)"  # errors of a correct variant's run, tied to no check
KINDS = ("false alarm", "miss", "wrong cause", "error")


@dataclass
class Incident:
    kind: str  # one of KINDS
    check: str
    target: str
    variant: str
    run: str  # the battery row, crash point or bug case
    fault: str
    run_dir: str
    detail: str


@dataclass
class Outcome:
    """One judged (or unjudgeable) chaos run."""

    target: str
    variant: str
    run: str
    fault: str
    expect: str | None  # the check the bug must fail; None: a correct variant
    words: tuple[str, ...] = ()
    report: dict[str, Any] | None = None  # report.json's content
    out_dir: str = ""
    error: str = ""  # why there is no report
    repeat: int = 0

    @property
    def run_dir(self) -> str:
        return (self.report or {}).get("run_dir") or self.out_dir

    def incidents(self) -> list[Incident]:
        def incident(kind: str, check: str, detail: str) -> Incident:
            return Incident(kind, check, self.target, self.variant, self.run, self.fault,
                            self.run_dir, detail)

        report = self.report
        if report is None:
            return [incident("error", self.expect or WHOLE_RUN, self.error or "no report")]
        checks = report.get("checks", {})
        if self.expect is None:
            found = [incident("false alarm", name, check["detail"])
                     for name, check in checks.items() if check["ok"] is False]
            if report["verdict"] == "error":
                found.append(incident("error", WHOLE_RUN, report.get("reason", "")))
            return found
        check = checks.get(self.expect)
        if check is None or check["ok"] is None or report["verdict"] == "error":
            why = check["detail"] if check else f"no check {self.expect!r} in the report"
            reason = report.get("reason")
            return [incident("error", self.expect, f"{why}; {reason}" if reason else why)]
        if check["ok"] is not False:
            return [incident("miss", self.expect, check["detail"])]
        missing = [w for w in self.words if w.lower() not in check["detail"].lower()]
        if missing:
            return [incident("wrong cause", self.expect,
                             f"does not name {missing}: {check['detail']}")]
        return []


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    def add(self, outcome: Outcome) -> list[Incident]:
        self.outcomes.append(outcome)
        return outcome.incidents()

    def incidents(self) -> list[Incident]:
        return [i for o in self.outcomes for i in o.incidents()]

    def checks(self) -> list[str]:
        names: dict[str, None] = {}
        for o in self.outcomes:
            names.update(dict.fromkeys((o.report or {}).get("checks", {})))
            if o.expect:
                names[o.expect] = None
        return [*names, WHOLE_RUN]

    def matrix(self) -> dict[str, dict[str, int]]:
        rows = {name: {"judged on correct": 0, "false alarms": 0, "expected to fail": 0,
                       "misses": 0, "wrong cause": 0, "errors": 0} for name in self.checks()}
        for o in self.outcomes:
            if o.expect is None:
                for name, check in (o.report or {}).get("checks", {}).items():
                    rows[name]["judged on correct"] += check["ok"] is not None
            else:
                rows[o.expect]["expected to fail"] += 1
        column = {"false alarm": "false alarms", "miss": "misses", "wrong cause": "wrong cause",
                  "error": "errors"}
        for incident in self.incidents():
            rows[incident.check][column[incident.kind]] += 1
        return rows

    def table(self) -> str:
        rows = self.matrix()
        width = max(len(n) for n in rows)
        head = (f"{'check':<{width}}  {'false alarms':>14}  {'misses':>8}  {'wrong cause':>11}"
                f"  {'errors':>6}")
        lines = [head, "-" * len(head)]
        for name, r in rows.items():
            if not any(r.values()):
                continue
            alarms = f"{r['false alarms']}/{r['judged on correct']}"
            misses = f"{r['misses']}/{r['expected to fail']}"
            lines.append(f"{name:<{width}}  {alarms:>14}  {misses:>8}  {r['wrong cause']:>11}"
                         f"  {r['errors']:>6}")
        correct = sum(o.expect is None for o in self.outcomes)
        lines.append(f"{len(self.outcomes)} run(s): {correct} on correct variants,"
                     f" {len(self.outcomes) - correct} on buggy ones"
                     " (false alarms / runs that judged the check; misses / bug runs expecting it)")
        for i in self.incidents():
            lines.append(f"  {i.kind.upper()}  {i.check}  {i.target}/{i.variant}  {i.run}"
                         f"  [{i.fault}]")
            lines.append(f"      {i.detail}")
            lines.append(f"      run dir: {i.run_dir}")
        return "\n".join(lines)

    def write(self, path: Path) -> Path:
        blob = {"matrix": self.matrix(),
                "incidents": [asdict(i) for i in self.incidents()],
                "runs": [{"target": o.target, "variant": o.variant, "run": o.run,
                          "fault": o.fault, "expect": o.expect, "words": list(o.words),
                          "repeat": o.repeat, "verdict": (o.report or {}).get("verdict"),
                          "checks": {n: c["ok"] for n, c in
                                     (o.report or {}).get("checks", {}).items()},
                          "run_dir": o.run_dir, "error": o.error}
                         for o in self.outcomes]}
        path.write_text(json.dumps(blob, indent=2) + "\n")
        return path


class MatrixPlugin:
    """Prints the tally at the end of the session and writes it as JSON."""

    name = "torchchaos-verdict-matrix"

    def __init__(self, tally: Tally, json_path: Path) -> None:
        self.tally, self.json_path = tally, json_path

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.tally.outcomes:
            return
        terminalreporter.section("torchchaos verdict matrix (independent targets)")
        for line in self.tally.table().splitlines():
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"written to {self.tally.write(self.json_path)}")
