"""hang: one rank stops making progress, and the job with it.

Every mode fires after step N on the chosen rank (`mode=`, default `stop`):

- `stop`: the rank's process is stopped with SIGSTOP, as a frozen node or a
  process paused by the kernel is. It is continued (SIGCONT) after `for=`
  seconds; without `for=`, once the job reacts (a peer rank exits: its
  collective timeout or watchdog fired) or when the run ends. Continuing it
  then only spares torchrun's 30 s wait before it SIGKILLs a worker that
  cannot act on its SIGTERM; the reaction being judged has happened.
- `collective`: the rank is held inside a collective its peers have entered:
  `op=ddp` (default) holds it at the next backward, before its gradients reach
  DDP's all-reduce; `op=all_reduce` (or `barrier`, `broadcast`, ...) holds it
  in the next call of that `torch.distributed` function. Its peers wait inside
  the real collective. Once a peer exits, the held call raises, as a real one
  does when a peer's connection closes; after `for=` seconds it goes on.
- `spin` (CUDA): a kernel that spins for `for=` seconds (default an hour) is
  queued on the rank's current stream, so every later kernel and NCCL
  collective on it waits behind a genuinely busy GPU.
- `mismatch`: the rank calls one extra `barrier()` that no peer calls: the
  classic collective-order deadlock (a collective under `if rank == 0:`).
- `gil`: the rank's training thread enters C code that holds the GIL and does
  not come back (libc's `sleep` called through `ctypes.PyDLL`, which keeps the
  GIL, as a C extension stuck in a lock or a catastrophic regex does). No
  Python runs in that process any more: not the agent's heartbeat, not a
  watchdog thread, not a signal handler. A SIGTERM the script handles in Python
  stays pending (torchrun SIGKILLs the rank after its grace); one it does not
  handle kills it, as it would. After `for=` seconds the call returns.

The fault counts as fired once the hang began (a `hang_begin` event); a
`collective` hold on an op the target never calls never fires.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchchaos.errors import UsageError
from torchchaos.faults.contract import (
    ClusterJob,
    ClusterMapping,
    FaultKind,
    FireContext,
    NotExported,
    ResolvedFault,
)
from torchchaos.faults.params import choice, seconds
from torchchaos.rundir.heartbeat import peers_gone
from torchchaos.rundir.layout import RunLayout

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

MODES = ("stop", "collective", "spin", "mismatch", "gil")
COLLECTIVES = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_object",
               "broadcast_object_list", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "reduce", "gather", "scatter")
SPIN_SECONDS = 3600.0  # "for good": the run ends long before
GIL_SECONDS = 3600  # likewise, for a GIL held without for=
HEALER = Path(__file__).with_name("stop_healer.py")
POLL_SECONDS = 0.1


class PeerExited(RuntimeError):
    """A held collective fails because a peer rank exited (its connection closed)."""


class Hang(FaultKind):
    name = "hang"
    summary = ("a rank stops making progress: SIGSTOP, held inside a collective, a spinning"
               " GPU kernel, an extra collective no peer calls, or C code holding the GIL")
    targets = ("rank",)
    effect_event = "hang_begin"
    params = {"mode": choice(MODES), "op": choice(("ddp", *COLLECTIVES)), "for": seconds}

    def chaos_mesh(self, fault: ResolvedFault, job: ClusterJob) -> ClusterMapping:
        mode = fault.params.get("mode", "stop")
        raise NotExported(f"a hang inside the rank's process (mode={mode}); Chaos Mesh cannot"
                          " freeze or hold a process (pod-failure restarts the container"
                          " instead)")

    def validate(self, params: dict[str, object]) -> None:
        if "op" in params and params.get("mode") != "collective":
            raise UsageError("hang op= applies to mode=collective only")
        if "for" in params and params.get("mode") == "mismatch":
            raise UsageError("hang mode=mismatch lasts until a timeout ends it; it takes no for=")

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        return {"hang": hangs(shape)}

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        mode = str(fault.params.get("mode", "stop"))
        duration = fault.params.get("for")
        held_for = float(duration) if duration is not None else None  # type: ignore[arg-type]
        if mode == "stop":
            _stop(fault, ctx, held_for)
        elif mode == "collective":
            _arm_hold(fault, ctx, str(fault.params.get("op", "ddp")), held_for)
        elif mode == "spin":
            _spin(fault, ctx, held_for or SPIN_SECONDS)
        elif mode == "gil":
            _hold_gil(fault, ctx, held_for)
        else:
            _extra_barrier(fault, ctx)


def _stop(fault: ResolvedFault, ctx: FireContext, held_for: float | None) -> None:
    """SIGSTOP this process; a small healer process continues it (see stop_healer)."""
    beats = RunLayout(Path(ctx.run_dir)).beats_dir
    # Its own session: torchrun signals each worker's whole process group when it tears
    # an attempt down, and the healer must outlive that to continue this process.
    subprocess.Popen(
        [sys.executable, str(HEALER), str(os.getpid()), str(beats), str(held_for or 0)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
    )
    ctx.record("hang_begin", id=fault.id, mode="stop", step=ctx.step())
    start = time.monotonic()
    os.kill(os.getpid(), signal.SIGSTOP)
    # Only once continued: after for= seconds, or because the job reacted.
    how = "peer exited" if peers_gone(beats, os.getpid()) else "released"
    ctx.record("hang_end", id=fault.id, mode="stop", how=how,
               seconds=round(time.monotonic() - start, 2))


def _arm_hold(fault: ResolvedFault, ctx: FireContext, op: str, held_for: float | None) -> None:
    if op == "ddp":
        if ctx.training is None:
            raise RuntimeError("hang op=ddp needs the agent's view of training")

        def at_backward(loss: Any) -> None:
            _hold(fault, ctx, "backward, before DDP's gradient all-reduce", held_for)

        ctx.training.before_next_backward(at_backward)
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    real = getattr(dist, op)

    def held_collective(*args: Any, **kwargs: Any) -> Any:
        setattr(dist, op, real)  # once
        setattr(c10d, op, real)
        _hold(fault, ctx, f"torch.distributed.{op}", held_for)
        return real(*args, **kwargs)

    setattr(dist, op, held_collective)
    setattr(c10d, op, held_collective)


def _hold(fault: ResolvedFault, ctx: FireContext, where: str, held_for: float | None) -> None:
    """Block here while the peers wait inside the collective."""
    ctx.record("hang_begin", id=fault.id, mode="collective", where=where, step=ctx.step())
    beats = RunLayout(Path(ctx.run_dir)).beats_dir
    start = time.monotonic()
    end = start + held_for if held_for is not None else math.inf
    while time.monotonic() < end:
        gone = peers_gone(beats, os.getpid())
        if gone:
            ctx.record("hang_end", id=fault.id, mode="collective", how="peer exited",
                       seconds=round(time.monotonic() - start, 2))
            raise PeerExited(f"rank(s) {gone} exited while this rank was in {where}"
                             " (torchchaos hang fault): connection closed by peer")
        time.sleep(POLL_SECONDS)
    ctx.record("hang_end", id=fault.id, mode="collective", how="released",
               seconds=round(time.monotonic() - start, 2))


def _spin(fault: ResolvedFault, ctx: FireContext, duration: float) -> None:
    import torch

    if not torch.cuda.is_available():
        ctx.record("hang_error", id=fault.id, error="mode=spin needs a CUDA device; this rank"
                                                    " has none")
        return
    device = torch.cuda.current_device()
    # clock_rate is in kHz where torch exposes it; 2 GHz is a safe guess for data-centre GPUs
    khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 2_000_000)
    ctx.record("hang_begin", id=fault.id, mode="spin", device=device, seconds=duration,
               step=ctx.step())
    torch.cuda._sleep(int(duration * khz * 1000))  # queued on the current stream; returns


def _hold_gil(fault: ResolvedFault, ctx: FireContext, held_for: float | None) -> None:
    """Sleep in C with the GIL held: every thread of this process stops with this one."""
    import ctypes

    libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL (CDLL would release it)
    # A signal the script handles in Python must not cut the sleep short: its handler
    # could not run in a real GIL-holding call either. Blocked in this thread only, the
    # kernel hands it to another thread, whose C handler marks it pending, and the
    # Python handler runs once the GIL is free. A signal left at its default action
    # (SIGTERM kills) still acts at once.
    handled = {sig for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                               signal.SIGUSR2)
               if callable(signal.getsignal(sig))}
    seconds = math.ceil(held_for) if held_for is not None else GIL_SECONDS
    ctx.record("hang_begin", id=fault.id, mode="gil", step=ctx.step(),
               where="libc sleep() through ctypes.PyDLL, holding the GIL")
    start = time.monotonic()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, handled)
    try:
        libc.sleep(seconds)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    ctx.record("hang_end", id=fault.id, mode="gil", how="released",
               seconds=round(time.monotonic() - start, 2))


def _extra_barrier(fault: ResolvedFault, ctx: FireContext) -> None:
    import torch.distributed as dist

    ctx.record("hang_begin", id=fault.id, mode="mismatch", where="an extra barrier no peer"
                                                                 " calls", step=ctx.step())
    dist.barrier()  # pairs with whatever collective the peers call next, or with nothing
    ctx.record("hang_end", id=fault.id, mode="mismatch", how="barrier returned")


def hangs(shape: JobShape, modes: Sequence[str] = ("stop", "collective")) -> SearchStrategy[str]:
    """A rank stops making progress after a step (SIGSTOP, or held in a collective)."""
    from hypothesis import strategies as st

    return st.builds(lambda r, s, m: f"hang:rank={r},step={s},mode={m}", shape.a_rank(),
                     shape.a_step(), st.sampled_from(list(modes)))
