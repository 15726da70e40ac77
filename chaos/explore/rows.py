"""A sweep's row: one planned chaos run (a name, its fault), and what it came to.

Every planner (the battery, crash points and states, a bit-flip campaign, a suite)
makes these; `runs` runs them and ends the sweep. A shard's manifest keeps a row as
`plan_row` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchchaos.report.report_file import Report
from torchchaos.scenario.spec import Spec


@dataclass
class Entry:
    name: str
    fault: Spec
    report: Report | None = None
    seed: int | None = None  # for the fault's seeded picks; None: the base scenario's
    start_from: str | None = None  # Scenario.start_from for this run
    error: str = ""  # why the run could not be judged, where it made no report

    def plan_row(self) -> dict[str, object]:
        """What a shard's manifest keeps of the row: its fault as text."""
        return {"name": self.name, "fault": str(self.fault), "seed": self.seed,
                "start_from": self.start_from}

    @classmethod
    def from_plan_row(cls, row: dict[str, Any]) -> Entry:
        return cls(row["name"], Spec.read(row["fault"]), seed=row["seed"],
                   start_from=row["start_from"])
