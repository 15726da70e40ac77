"""Continue a rank stopped by `hang:mode=stop` (run as a script: a stopped
process cannot continue itself).

    python stop_healer.py PID BEATS_DIR SECONDS

Sends SIGCONT to PID after SECONDS (0: no time limit), or as soon as a peer
rank of its attempt has exited (the job reacted), and ends when PID is gone.
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


def heal_when_due(pid: int, beats: Path, seconds: float) -> None:
    end = time.monotonic() + seconds if seconds > 0 else math.inf
    while pid_alive(pid):
        if time.monotonic() >= end or peers_gone(beats, pid):
            os.kill(pid, signal.SIGCONT)
            return
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    heal_when_due(int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))
