"""abort: one rank's process group is aborted, as a communicator is torn down under it.

torch aborts a communicator when its watchdog gives up on a collective, when
a fault-tolerant trainer (torchft) evicts a replica, or when code calls
`torch.distributed.distributed_c10d._abort_process_group()` to recover. The
rank's connections close; its own next (or current) collective fails, and its
peers meet closed connections (gloo: `Connection closed by peer`) or, where
the backend only notices at a timeout, a hang. What they do next is judged.

The abort runs `after=` seconds (default 0.05) after the trigger from a
thread of the rank's own, so it lands while the training thread goes on into
its next step's collectives (DDP's gradient all-reduce), not between two.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from torchchaos.faults.contract import (
    ClusterJob,
    ClusterMapping,
    FaultKind,
    FireContext,
    NotExported,
    ResolvedFault,
)
from torchchaos.faults.params import seconds

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

DEFAULT_AFTER = 0.05


class Abort(FaultKind):
    name = "abort"
    summary = "one rank's process group (communicator) is aborted while it trains"
    targets = ("rank",)
    params = {"after": seconds}
    marks = ("abort",)
    effect_event = "abort"

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        from hypothesis import strategies as st

        return {"abort": st.builds(lambda r, s: f"abort:rank={r},step={s}", shape.a_rank(),
                                   shape.a_step())}

    def said(self, event: dict[str, Any]) -> str:
        return f"its process group aborted {event.get('after'):g} s after the step"

    def chaos_mesh(self, fault: ResolvedFault, job: ClusterJob) -> ClusterMapping:
        raise NotExported("a communicator inside the training process; the nearest cluster"
                          " fault is a network partition of the pod")

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        after = float(fault.params.get("after", DEFAULT_AFTER))  # type: ignore[arg-type]
        step = ctx.step()

        def abort_later() -> None:
            from torch.distributed import distributed_c10d

            time.sleep(after)
            # recorded first: the training thread may die of the abort at once, and the
            # process with it, before this thread runs again
            ctx.record("abort", id=fault.id, step=step, after=after)
            try:
                distributed_c10d._abort_process_group()
            except Exception as exc:  # noqa: BLE001 - said in the history, not raised here
                ctx.record("fault_error", id=fault.id, error=f"abort failed: {exc}"[:300])

        threading.Thread(target=abort_later, name="torchchaos-abort", daemon=True).start()
