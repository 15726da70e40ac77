"""Is a run still working while none of its ranks reports progress?

Between two attempts of a job no rank beats: torchrun tears the old workers
down, meets its peers again and starts new workers, which import torch before
their agent boots. On a loaded machine (two cores shared with other jobs)
that alone can outlast the hang bound. A start-up that is under way burns CPU;
a torchrun that waits for a node that will never come, or a worker stuck at
import, does not. So the hang detector's "no new attempt started" is checked
against the CPU time the run's processes (found by their marker) used since
the last look.
"""

from __future__ import annotations

import time

import psutil

from torchchaos.host import procs

# A waiting torchrun polls its workers ten times a second (a few % of a core);
# importing torch takes a whole core. A quarter of a core tells them apart.
BUSY_SHARE = 0.25


class RunCpu:
    """The CPU seconds of one run's processes."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def busy(self, seconds: float = 0.5) -> bool:
        """Did the run's processes use more than BUSY_SHARE of a core over the next
        `seconds`? (A process born meanwhile counts from zero.)"""
        before, started = self._cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        after = self._cpu_seconds()
        spent = sum(used - before.get(pid, 0.0) for pid, used in after.items())
        return spent / (time.monotonic() - started) > BUSY_SHARE

    def _cpu_seconds(self) -> dict[int, float]:
        found = {}
        for pid in procs.marked_pids(self.run_id):
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            found[pid] = times.user + times.system
        return found
