"""pause: one rank stops for `for=` seconds, once, then goes on.

A stop-the-world garbage collection, a swap storm, a host-side hiccup or a
debugger attached for a moment: the rank is alive but makes no progress, and
its peers wait for it inside the next collective. A correct job absorbs it: a
pause shorter than the job's collective timeout must cost time, never a
restart. Keep `for=` below the harness's `--hang-timeout` (default 10 s), or
the harness will rightly call it a hang.

Unlike `hang:mode=stop,for=` (SIGSTOP: every thread of the process frozen),
only the training loop stops; the process's other threads (a background
checkpoint writer, the harness's heartbeat) go on.

The pause happens on the training thread, after an optimizer step: a
`step=N` trigger pauses right after step N. A trigger that fires on another
thread (`time=`, or a save on a background writer) arms the pause for the end
of the next step instead, so it is always the training loop that stops.
"""

from __future__ import annotations

import threading
import time

from torchchaos.errors import UsageError
from torchchaos.faults.contract import FaultKind, FireContext, ResolvedFault
from torchchaos.faults.params import seconds

DEFAULT_SECONDS = 2.0


class Pause(FaultKind):
    """The fault kind: what the spec `pause:rank=0,step=5,for=2` names."""

    name = "pause"  # must equal the entry point's name in pyproject.toml
    summary = "stop one rank for a while, once (a GC pause, a swap storm, a host hiccup)"
    targets = ("rank",)  # rank=N only: a node-wide pause would be a different kind
    params = {"for": seconds}  # `for=2.5`; a parser raises ValueError on bad input
    # The fault counts as fired once the pause itself is recorded (it may be armed first),
    # and the report's timeline marks that event on the rank's lane.
    effect_event = "pause"
    marks = ("pause",)

    def validate(self, params: dict[str, object]) -> None:
        if float(params.get("for", DEFAULT_SECONDS)) <= 0:  # type: ignore[arg-type]
            raise UsageError("pause: for= needs more than 0 seconds")

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        if ctx.training is None:
            raise RuntimeError("pause needs the agent's view of training")
        training = ctx.training
        length = float(fault.params.get("for", DEFAULT_SECONDS))  # type: ignore[arg-type]

        def pause(step: int) -> bool:
            # The event goes to this rank's history first: if the rank dies while it
            # is paused, the pause is still on record.
            ctx.record("pause", id=fault.id, step=step, seconds=length)
            time.sleep(length)
            return False  # once: no more calls after this step

        if threading.current_thread() is threading.main_thread():
            pause(training.step())
        else:
            training.after_every_step(pause)
