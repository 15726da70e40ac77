"""How long a rank waited for a CPU since its last progress.

On a loaded machine (a CI runner shared with other jobs, two cores for many processes)
a rank in a long training step is slow, not stuck: much of its wall time it is
runnable but another process has the core. A hang bound counted in wall time runs out
on such a rank; counted in time the rank could have run, it does not. The kernel keeps
that time for every thread: the second field of /proc/PID/schedstat is the nanoseconds
the thread spent waiting on a run queue.

A hung rank is not runnable (stopped, asleep holding the GIL, blocked in a collective
on a dead or frozen peer), so it waits for no CPU and its clock runs as the wall clock:
a real hang is still found within the bound, under any load.

Only the main thread is read: the training step runs there (forward, backward, the
optimiser; torch's intra-op pool helps it, and the main thread takes part). A
collective's own transfer threads (gloo's) are not read, so a single collective slowed
past the bound by load is still counted as a stall; reading every thread of every rank
ten times a second would cost more CPU than it saves.
"""

from __future__ import annotations

NANOSECONDS = 1e9


def waited_seconds(pid: int) -> float | None:
    """Seconds the process's main thread has spent waiting for a CPU since it started;
    None when the process is gone or the kernel keeps no such count."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[1]) / NANOSECONDS
    except (OSError, ValueError, IndexError):
        return None


class WaitSinceProgress:
    """Per process, the CPU wait since its last progress: the count read when the
    progress was first seen is the base, so the wait is the count's growth since."""

    def __init__(self) -> None:
        self._base: dict[int, tuple[float, float]] = {}  # pid -> (progress_t, count then)

    def seconds(self, pid: int, progress_t: float) -> float:
        count = waited_seconds(pid)
        if count is None:
            return 0.0
        base = self._base.get(pid)
        if base is None or base[0] != progress_t:
            self._base[pid] = (progress_t, count)  # a new progress: it waited for none since
            return 0.0
        return count - base[1]

    def keep_only(self, pids: set[int]) -> None:
        """Forget the processes that are gone (each attempt's ranks are new ones)."""
        for pid in set(self._base) - pids:
            del self._base[pid]
