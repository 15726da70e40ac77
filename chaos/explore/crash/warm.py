"""A recovery started before it is needed: a job held at its gate, in a thread.

A crash-state sweep knows which state its next recovery starts from only once the
current one ended (its view decides which states it already covers). So the next
recovery's torchrun starts early and its ranks warm up (`torchchaos.harness.gate`):
once the current one's ranks are past their start-up (the sweep keeps two held
then), or, where the current one loads a large folder through the fault filesystem
and keeps the cores busy, once it ended, while the sweep judges the states it covers.
The state that needs it opens the gate; a held job no state needed is cancelled
before its script runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from torchchaos.harness import runner
from torchchaos.harness.gate import Fill, Gate
from torchchaos.harness.runner import Job, JobOutcome

STARTED_POLL_SECONDS = 0.02


class HeldJob:
    def __init__(self, make_job: Callable[[Gate], Job]) -> None:
        self.gate = Gate()
        self.job = make_job(self.gate)
        self._outcome: JobOutcome | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="torchchaos-held", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._outcome = self.job.run()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            self._error = exc

    def open(self, fill: Fill) -> None:
        """Let the job go on from the folder `fill` writes."""
        self.gate.open(fill)

    def wait_started(self) -> None:
        """Wait until every rank of the opened job is past its start-up (its agent keeps
        a beat) or the job ended: a job warming up beside another's start-up would
        slow both, on a machine whose cores the start-ups fill."""
        world = self.job.scenario.world_size
        beats = self.job.layout.beats_dir
        self._join(until=lambda: len(list(beats.glob("rank-*.json"))) >= world)

    def outcome(self) -> JobOutcome:
        """Wait until the opened job ended."""
        self._join()
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome

    def cancel(self) -> None:
        """End the job before its script starts (its processes reaped, its mount gone)."""
        self.gate.cancel()
        self._join()

    def _join(self, until: Callable[[], bool] = lambda: False) -> None:
        """Wait until the job's thread ended, or `until()` holds."""
        try:
            while self._thread.is_alive() and not until():
                self._thread.join(STARTED_POLL_SECONDS)
        except BaseException:  # Ctrl-C here: the job stops, heals and reaps in its thread
            runner.cancel_all()
            self._thread.join()
            runner.reset_cancel()
            raise
