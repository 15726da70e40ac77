"""Is a run still working while none of its ranks reports progress?

At start-up no rank has stepped yet: torchrun starts its workers, which import torch
(some of it after their agent boots), initialise the process group and meet their
peers. Between two attempts no rank beats at all: torchrun tears the old workers down,
meets its peers again and starts new ones. On a loaded machine (two cores shared with
other jobs) either can outlast the hang bound. A start-up that is under way burns CPU;
a torchrun that waits for a node that will never come, a worker stuck at import, or
ranks waiting in a rendezvous for a dead peer do not. So a "hang" found while no rank
of the attempt has begun a step is checked against the CPU time the run's processes
(found by their marker) use over half a second: one place for the reference, every
chaos run and the restarts inside them. Once a rank has stepped, CPU is no excuse (a
rank spinning in a hang burns CPU too).

Time a process spent waiting for a core counts as use (`torchchaos.host.cpuwait`): on a
machine loaded many times over, a worker importing torch gets less than a quarter of a
core, but it is runnable all the while, which a waiting torchrun is not.
"""

from __future__ import annotations

import time

import psutil

from torchchaos.host import cpuwait, procs

# A waiting torchrun polls its workers ten times a second (a few % of a core);
# importing torch takes a whole core. A quarter of a core tells them apart.
BUSY_SHARE = 0.25


class RunCpu:
    """The CPU seconds of one run's processes, each with the time it waited for one."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def busy(self, seconds: float = 0.5) -> bool:
        """Did the run's processes use (or wait for) more than BUSY_SHARE of a core over
        the next `seconds`? (A process born meanwhile counts from zero.)"""
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
            found[pid] = times.user + times.system + (cpuwait.waited_seconds(pid) or 0.0)
        return found
