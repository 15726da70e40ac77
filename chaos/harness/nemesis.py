"""Harness faults: injected from outside the job by the runner, healed on time.

Some faults cannot be made from inside a rank: a network partition changes
firewall rules of whole nodes, a Toxiproxy toxic changes a proxy. Their
triggers are still the job's (a step, a time), so the agent in the target's
first rank notices the trigger as for any fault and asks the harness to act
(`request`: a file under `_chaos/requests/`, then it waits until the harness
says the fault is in place, so "at step N" means before step N + 1 begins).

The runner polls a `Nemesis` (Jepsen's name for the process that breaks the
system under test) while it waits for the job: it applies requested faults,
heals each at the end of its window (`for=`; `flaps=` windows `gap=` apart)
and heals everything still in force when the job ends, whatever way it ends.
Each cut and heal is an event in the harness history.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchchaos.rundir.layout import RunLayout

if TYPE_CHECKING:
    from torchchaos.faults.contract import JobContext
    from torchchaos.rundir.history import HistoryWriter
    from torchchaos.scenario.schedule import ResolvedFault



Heal = Callable[[], None]


@dataclass
class Window:
    """One period during which a fault is in force (a flapping fault has several)."""

    fault: ResolvedFault
    number: int  # 1-based
    start: float  # monotonic seconds
    end: float | None  # None: until the job ends
    heal: Heal | None = None  # set while the fault is in force


def windows(fault: ResolvedFault, begin: float) -> list[Window]:
    """The windows of a fault triggered at `begin`, from its `for=`, `flaps=`, `gap=`."""
    length = fault.params.get("for")
    if length is None:
        return [Window(fault, 1, begin, None)]
    length = float(length)  # type: ignore[arg-type]
    period = length + float(fault.params.get("gap", length))  # type: ignore[arg-type]
    flaps = int(fault.params.get("flaps", 1))  # type: ignore[call-overload]
    return [Window(fault, n + 1, begin + n * period, begin + n * period + length)
            for n in range(flaps)]


class Nemesis:
    """Applies and heals the harness faults of one job (see the module docstring)."""

    def __init__(self, faults: list[ResolvedFault], ctx: JobContext, log: HistoryWriter,
                 cut: Callable[[ResolvedFault, JobContext], tuple[Heal, dict[str, Any]]]) -> None:
        self.waiting = {f.id: f for f in faults}
        self.ctx = ctx
        self.log = log
        self.cut = cut
        self.windows: list[Window] = []
        self.requests = RunLayout(ctx.run_dir).requests_dir

    def poll(self) -> None:
        if not self.waiting and not self.windows:
            return
        now = time.monotonic()
        requested = self._requested()
        for fault_id in requested:
            self.windows += windows(self.waiting.pop(fault_id), now)
        self._due(now)
        for fault_id in requested:  # in force before the rank hears back
            (self.requests / f"{fault_id}.done").touch()

    def _requested(self) -> list[str]:
        if not self.requests.is_dir():
            return []
        return [p.stem for p in sorted(self.requests.glob("*.json")) if p.stem in self.waiting]

    def _due(self, now: float) -> None:
        for window in list(self.windows):
            if window.heal is None and window.start <= now:
                self._begin(window)
            if window.heal is not None and window.end is not None and window.end <= now:
                self._end(window)
                self.windows.remove(window)

    def _begin(self, window: Window) -> None:
        fault = window.fault
        try:
            window.heal, details = self.cut(fault, self.ctx)
        except Exception as exc:  # noqa: BLE001 - recorded; the run goes on without it
            self.log.record("fault_error", id=fault.id, error=str(exc))
            self.windows.remove(window)
            return
        self.log.record("nemesis_begin", id=fault.id, kind=fault.kind, window=window.number,
                        seconds=None if window.end is None else round(window.end - window.start,
                                                                      3),
                        **details)

    def _end(self, window: Window) -> None:
        heal, window.heal = window.heal, None
        if heal is not None:
            heal()
            self.log.record("nemesis_end", id=window.fault.id, kind=window.fault.kind,
                            window=window.number)

    def heals_by(self) -> float:
        """When the last timed window applied or scheduled ends (0: none is): until then
        a stalled job may only be waiting for the network to come back."""
        return max((w.end for w in self.windows if w.end is not None), default=0.0)

    def close(self) -> None:
        """Heal whatever is still in force (every exit path of the job)."""
        for window in self.windows:
            self._end(window)
        self.windows = []
