"""dataloader: one of a rank's DataLoader worker processes dies or gets stuck.

A `torch.utils.data.DataLoader` with `num_workers > 0` reads batches in
worker processes. When one dies (the OOM killer picks it, a native crash in
a decoder), the rank learns it on its next batch through torch's own path:
the SIGCHLD handler and the `DataLoader worker (pid N) is killed by signal`
error. When one is stuck (NFS, a deadlocked decoder), the rank waits for its
batch forever unless the loader has a `timeout=`.

- `mode=kill` (default): SIGKILL to one live worker of the rank's
  multi-process data-loader iterators (the `worker=`-th, default 0);
- `mode=stop`: SIGSTOP to it; it is continued after `for=` seconds, or once
  its rank or a peer rank exited (a small healer process, as `hang` uses).
  The rank waits for that worker's next batch: a hang (a `hang_begin` event),
  judged by `hang_detected` as the `hang` kind's are.

A rank with no worker process at the trigger (`num_workers=0`, or between
epochs without `persistent_workers`) records `fault_error` and the fault does
not fire.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchchaos.errors import UsageError
from torchchaos.faults.contract import FaultKind, FireContext, ResolvedFault
from torchchaos.faults.params import choice, non_negative_int, seconds
from torchchaos.rundir.layout import RunLayout

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

MODES = ("kill", "stop")
HEALER = Path(__file__).with_name("stop_healer.py")


class DataLoaderWorker(FaultKind):
    name = "dataloader"
    summary = "one DataLoader worker process of a rank is killed (SIGKILL) or stopped (SIGSTOP)"
    not_on_a_cluster = ("a worker process inside the rank's pod; Chaos Mesh kills containers, not"
                        " one child process of one")
    targets = ("rank",)
    params = {"mode": choice(MODES), "worker": non_negative_int, "for": seconds}
    choices = {"mode": MODES}
    marks = ("dataloader_worker",)
    effect_event = "dataloader_worker"

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        from hypothesis import strategies as st

        return {"dataloader": st.builds(
            lambda r, s, m: f"dataloader:rank={r},step={s},mode={m}", shape.a_rank(),
            shape.a_step(), st.sampled_from(list(MODES)))}

    def said(self, event: dict[str, Any]) -> str:
        what = "SIGKILL" if event.get("mode") == "kill" else "SIGSTOP"
        return (f"{what} to DataLoader worker {event.get('pid')} (one of"
                f" {event.get('workers')})")

    def validate(self, params: dict[str, object]) -> None:
        if "for" in params and params.get("mode") != "stop":
            raise UsageError("dataloader for= applies to mode=stop only")

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        mode = str(fault.params.get("mode", "kill"))
        index = int(fault.params.get("worker", 0))  # type: ignore[call-overload]
        workers = live_workers()
        step = ctx.step()
        if not workers:
            ctx.record("fault_error", id=fault.id, error="this rank has no DataLoader worker"
                       " process (num_workers=0, or no iterator alive) at the trigger")
            return
        pid = workers[index % len(workers)]
        if mode == "stop":
            held_for = float(fault.params.get("for", 0.0))  # type: ignore[arg-type]
            beats = RunLayout(Path(ctx.run_dir)).beats_dir
            subprocess.Popen([sys.executable, str(HEALER), str(pid), str(beats), str(held_for),
                              str(os.getpid())], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, start_new_session=True)
        ctx.record("dataloader_worker", id=fault.id, mode=mode, pid=pid, workers=len(workers),
                   step=step)
        os.kill(pid, signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
        if mode == "stop":  # the rank will wait for that worker's batch: a hang to react to
            ctx.record("hang_begin", id=fault.id, mode="dataloader", step=step,
                       where=f"waiting for a batch of its stopped DataLoader worker {pid}")


def live_workers() -> list[int]:
    """The pids of the live worker processes of this process's multi-process DataLoader
    iterators, in the order their iterators were made."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    # type(), not isinstance(): isinstance reads `__class__`, which some objects in the
    # heap answer with a deprecation warning (torch.distributed's old `reduce_op`)
    iterators: list[Any] = [o for o in gc.get_objects()
                            if issubclass(type(o), _MultiProcessingDataLoaderIter)]
    return [w.pid for it in iterators for w in getattr(it, "_workers", [])
            if w.pid is not None and w.is_alive()]
