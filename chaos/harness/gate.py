"""A job held before its script starts: warm recoveries of crash states (issue 29).

A crash-state sweep runs one short recovery per distinct folder image, and most of a
recovery is start-up: torchrun, the interpreters, `import torch`. A job given a
`Gate` launches at once with its ranks waiting in the agent (`env.GATE`), torch
imported, before the script's first line; the sweep decides meanwhile which state it
recovers and `open`s the gate with what writes that state's folder, or `cancel`s it
when no state is left. The job's clock, deadline and hang watch start when the gate
opens: the wait is no part of the recovery.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from torchchaos.errors import ChaosError

if TYPE_CHECKING:
    from torchchaos.faults.faultfs.mount import Mount

# lays out the folder a job starts from, given the recording mount over it: files written
# behind it (`Mount.backing()`), or extents of a recording laid over them (`Mount.request`)
Fill = Callable[["Mount"], None]


class Gate:
    def __init__(self) -> None:
        self._decided = threading.Event()
        self._fill: Fill | None = None

    def open(self, fill: Fill) -> None:
        """Let the job go on from the folder `fill` writes."""
        self._fill = fill
        self._decided.set()

    def cancel(self) -> None:
        """End the job before its script starts: it is not needed."""
        self._fill = None
        self._decided.set()

    def wait(self, interrupted: threading.Event, poll_seconds: float = 0.1) -> Fill | None:
        """What the job starts from once decided (None: cancelled); the job's side.
        `interrupted` set (a Ctrl-C reached another thread) stops the wait."""
        while not self._decided.wait(poll_seconds):
            if interrupted.is_set():
                raise KeyboardInterrupt("cancelled")
        return self._fill


class GateError(ChaosError):
    """A gate given to a job it cannot hold (one with faults, or nothing recorded)."""
