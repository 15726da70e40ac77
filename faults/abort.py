"""abort: one rank's process group is aborted, as a communicator is torn down under it.

torch aborts a communicator when its watchdog gives up on a collective, when
a fault-tolerant trainer (torchft) evicts a replica, or when code calls
`torch.distributed.distributed_c10d._abort_process_group()` to recover. The
rank's connections close; its own next (or current) collective fails, and its
peers meet closed connections (gloo: `Connection closed by peer`) or, where
the backend only notices at a timeout, a hang. What they do next is judged.

The abort runs from a thread of the rank's own as the rank's next
`loss.backward()` begins (`after=` seconds later, default 0), so it lands
while the training thread is in that step's collectives (DDP's gradient
all-reduce), not between two, however fast the steps are. A clock started at
the trigger did not: on a fast machine a 1 ms step ran 13 steps to the end of
training in 40 ms, and an abort 50 ms after its trigger landed in the
rank's teardown, where it tested nothing (plain_ddp.py, 2026-11-28). A rank
with no backward the agent sees (no view of training) starts the clock at the
trigger.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from torchchaos.faults.contract import FaultKind, FireContext, ResolvedFault
from torchchaos.faults.params import seconds

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

DEFAULT_AFTER = 0.0


class Abort(FaultKind):
    name = "abort"
    summary = "one rank's process group (communicator) is aborted while it trains"
    not_on_a_cluster = ("a communicator inside the training process; the nearest cluster fault is"
                        " a network partition of the pod")
    targets = ("rank",)
    params = {"after": seconds}
    marks = ("abort",)
    effect_event = "abort"

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        from hypothesis import strategies as st

        return {"abort": st.builds(lambda r, s: f"abort:rank={r},step={s}", shape.a_rank(),
                                   shape.a_step())}

    def said(self, event: dict[str, Any]) -> str:
        after = event.get("after") or 0
        if event.get("step") is None:  # no view of training: timed from the trigger
            return f"its process group aborted {after:g} s after the trigger"
        late = f"{after:g} s after" if after else "as"
        return f"its process group aborted {late} the backward of step {event['step']}"

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        after = float(fault.params.get("after", DEFAULT_AFTER))  # type: ignore[arg-type]

        def abort_later() -> None:
            from torch.distributed import distributed_c10d

            time.sleep(after)
            # recorded first: the training thread may die of the abort at once, and the
            # process with it, before this thread runs again; the step is the one whose
            # backward is under way (steps done, plus one)
            done = ctx.step()
            ctx.record("abort", id=fault.id, step=None if done is None else done + 1,
                       after=after)
            try:
                distributed_c10d._abort_process_group()
            except Exception as exc:  # noqa: BLE001 - said in the history, not raised here
                ctx.record("fault_error", id=fault.id, error=f"abort failed: {exc}"[:300])

        def start(_loss: Any = None) -> None:
            threading.Thread(target=abort_later, name="torchchaos-abort", daemon=True).start()

        if ctx.training is not None:
            ctx.training.before_next_backward(start)
        else:
            start()
