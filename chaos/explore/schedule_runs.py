"""Run fault schedules as real chaos runs, one numbered run directory each.

The bridge between the search engine (`torchchaos.explore.search`, which only sees
schedules and outcomes) and the harness: each schedule is the base scenario with
those faults, run in `out_dir/NN/` by `runs.run_row`, as a battery's rows are.
"""

from __future__ import annotations

from pathlib import Path

from torchchaos.explore import runs
from torchchaos.explore.search import ERROR, describe
from torchchaos.progress import Progress
from torchchaos.report.report_file import Report
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import Spec


class ScheduleRuns:
    """Callable: a schedule -> "pass" | "fail" | "error", keeping every report."""

    def __init__(self, base: Scenario, out_dir: Path, cache_dir: Path,
                 progress: Progress | None = None) -> None:
        self.base, self.out_dir, self.cache_dir = base, out_dir, cache_dir
        self.progress = progress or (lambda _msg: None)
        self.reports: list[tuple[list[str], Report | None]] = []

    def __call__(self, schedule: list[str]) -> str:
        # the engine's own progress lines stay out: the search says one line a run
        report, error = runs.run_row(describe(schedule), [Spec.read(s) for s in schedule],
                                     self.base, self.out_dir / f"{len(self.reports) + 1:02d}",
                                     self.cache_dir)
        if report is None:
            self.progress(f"could not judge {' '.join(schedule)}: {error}")
        self.reports.append((list(schedule), report))
        return report.verdict if report else ERROR

    def last_run_of(self, schedule: list[str]) -> Report | None:
        """The report of the latest run of this schedule, if it ran."""
        return next((r for s, r in reversed(self.reports) if s == list(schedule)), None)
