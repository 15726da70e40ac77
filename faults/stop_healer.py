"""Continue a rank stopped by `hang:mode=stop`, or a data-loader worker stopped by
`dataloader:mode=stop` (run as a script: a stopped process cannot continue itself).

    python stop_healer.py PID BEATS_DIR SECONDS [RANK_PID]

Sends SIGCONT to PID after SECONDS (0: no time limit), or as soon as a peer
rank of its attempt has exited (the job reacted), and ends when PID is gone.
For a worker, RANK_PID is the rank it serves: its peers are that rank's, and
the worker is continued once that rank is gone too (so it sees its parent gone
and exits).
It carries the run's marker in its environment, so the harness reaps it with
the run whatever happens. Kept free of torch so it starts in a blink.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

from torchchaos.host.procs import pid_alive
from torchchaos.rundir.heartbeat import peers_gone

POLL_SECONDS = 0.1


def heal_when_due(pid: int, beats: Path, seconds: float, rank_pid: int | None = None) -> None:
    end = time.monotonic() + seconds if seconds > 0 else math.inf
    rank = rank_pid or pid
    while pid_alive(pid):
        if time.monotonic() >= end or peers_gone(beats, rank) or not pid_alive(rank):
            os.kill(pid, signal.SIGCONT)
            return
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    heal_when_due(int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]),
                  int(sys.argv[4]) if len(sys.argv) > 4 else None)
