"""kill: a rank or a whole simulated node dies.

`signal=SIGKILL` (default) is a crash with no warning; `SIGTERM` is a
preemption notice: the target may checkpoint and exit, and is SIGKILLed if it
is still alive after `grace` seconds; `SIGSEGV` is a native crash; `exit`
makes the process exit with `code` (default 1) without running any handler.

A node is its torchrun agent plus all its workers. torchrun starts each worker
in its own session, so killing torchrun alone would leave the workers
training; a node kill walks the real process tree instead. A node SIGTERM
goes to the torchrun agent only, which forwards it to its workers the way a
cluster's preemption notice does.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

import psutil

from torchchaos.faults.contract import (
    ClusterChaos,
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

SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGSEGV": signal.SIGSEGV,
           "SIGINT": signal.SIGINT, "exit": None}


def _signal(value: str) -> str:
    name = value.upper() if value.lower() != "exit" else "exit"
    if not name.startswith("SIG") and name != "exit":
        name = "SIG" + name
    if name not in SIGNALS:
        raise ValueError(f"unknown signal {value!r} (known: {', '.join(SIGNALS)})")
    return name


def _sigkill_later(pids: list[int], delay: float) -> None:
    def run() -> None:
        time.sleep(delay)
        _sigkill_all(pids)

    threading.Thread(target=run, daemon=True).start()


def _sigkill_all(pids: list[int]) -> None:
    me = os.getpid()
    for pid in [p for p in pids if p != me] + ([me] if me in pids else []):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass



class Kill(FaultKind):
    name = "kill"
    summary = "kill a rank or a node (SIGKILL, SIGTERM with grace, SIGSEGV, exit)"
    params = {"signal": _signal, "grace": seconds, "code": int}

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        from hypothesis import strategies as st

        def at_steps(extra: str = "") -> SearchStrategy[str]:
            return st.builds(lambda r, s: f"kill:rank={r},step={s}{extra}", shape.a_rank(),
                             shape.a_step())

        return {
            # a crash: no chance to react
            "kill": at_steps(),
            # a preemption notice: SIGTERM, then SIGKILL after the grace period
            "preempt": at_steps(",signal=SIGTERM"),
            # a whole node (its torchrun agent and workers)
            "node_kill": st.builds(lambda n, s: f"kill:node={n},step={s}", shape.a_node(),
                                   shape.a_step()) if shape.nodes > 1 else None,
            # the writer right after a file event of one of its checkpoint saves
            "save_kill": st.builds(lambda p: f"kill:rank={shape.writer},phase=checkpoint_save,"
                                             f"save={p[0]},event={p[1]}",
                                   shape.a_save_point()) if shape.save_events else None,
        }

    def chaos_mesh(self, fault: ResolvedFault, job: ClusterJob) -> ClusterMapping:
        pods = job.pods_of(fault)
        if pods is None:
            raise NotExported(job.rank_reason(fault))
        preempt = fault.params.get("signal") == "SIGTERM"
        # A preemption notice is a pod deletion with a grace period: the pod gets SIGTERM and
        # is killed after it. Every other signal kills a node's processes at once.
        grace = math.ceil(float(fault.params.get("grace", 30.0))) if preempt else 0  # type: ignore[arg-type]
        spec = {"action": "pod-kill", "mode": "all", "selector": job.selector(pods),
                "gracePeriod": grace}
        note = ""
        if fault.params.get("signal") in ("SIGSEGV", "SIGINT", "exit"):
            note = f"signal {fault.params['signal']} becomes a pod kill without grace"
        return [ClusterChaos("PodChaos", spec, deadline=max(1.0, grace))], note

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        sig = str(fault.params.get("signal", "SIGKILL"))
        grace = float(fault.params.get("grace", 30.0))  # type: ignore[arg-type]
        code = int(fault.params.get("code", 1))  # type: ignore[call-overload]
        if fault.target_type == "node":
            self.kill_node(sig, grace, code)
        else:
            self._kill_self(sig, grace, code)

    def _kill_self(self, sig: str, grace: float, code: int) -> None:
        if sig == "exit":
            os._exit(code)
        if sig == "SIGTERM":
            _sigkill_later([os.getpid()], grace)
        os.kill(os.getpid(), SIGNALS[sig])

    def kill_node(self, sig: str, grace: float, code: int) -> None:
        launcher = psutil.Process(os.getppid())
        tree = [launcher.pid] + [c.pid for c in launcher.children(recursive=True)]
        if sig == "SIGTERM":
            _sigkill_later(tree, grace)
            os.kill(launcher.pid, signal.SIGTERM)
            return
        _sigkill_all(tree[:1])  # the launcher first, so it cannot restart the workers
        if sig == "exit":
            _sigkill_all([p for p in tree[1:] if p != os.getpid()])
            os._exit(code)
        _sigkill_all(tree[1:])
