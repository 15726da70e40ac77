"""straggler: a rank slowed by `delay=` seconds per step, from step N on.

The delay is spent after each of the rank's optimizer steps, so its peers
wait for it inside the next step's all-reduce: the whole job runs at the
straggler's pace, as it does behind a thermally throttled GPU or a slow host.
`steps=` limits it to that many steps (default: for good, or until the
process restarts).
"""

from __future__ import annotations

import time

from torchchaos.faults.contract import FaultKind, FireContext, ResolvedFault
from torchchaos.faults.params import positive_int, seconds


class Straggler(FaultKind):
    name = "straggler"
    summary = "slow one rank down by a delay per step (for a while or for good)"
    not_on_a_cluster = ("slows one rank by a delay per step from inside its process; Chaos Mesh "
                        "has no per-step delay")
    targets = ("rank",)
    params = {"delay": seconds, "steps": positive_int}
    marks = ("straggler",)

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        if ctx.training is None:
            raise RuntimeError("straggler needs the agent's view of training")
        delay = float(fault.params.get("delay", 0.5))  # type: ignore[arg-type]
        left = [int(fault.params.get("steps", 0)) or None]  # type: ignore[call-overload]
        ctx.record("straggler", id=fault.id, delay=delay, steps=left[0])

        def slow_down(step: int) -> bool:
            time.sleep(delay)
            if left[0] is None:
                return True
            left[0] -= 1
            return left[0] > 0

        if slow_down(ctx.training.step()):  # the trigger step is the first one slowed
            ctx.training.after_every_step(slow_down)
