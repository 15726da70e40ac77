"""crash: a native crash inside a rank, by the real fault, not a signal sent to it.

`kill:signal=SIGSEGV` delivers a signal from outside (`kill(2)`); a real
native crash is the kernel's reaction to what the process itself did, and
what the job leaves differs with it: faulthandler's "Fatal Python error"
dump (where the script enabled it: `PYTHONFAULTHANDLER`, `faulthandler.enable()`
or torchelastic's `@record`), the signal's siginfo, a core where core dumps are
on. Each `signal=` is made the way such crashes happen in the field:

- `segv` (default): a read of address 0 through `ctypes.string_at`, a NULL
  dereference in native code (SIGSEGV, SEGV_MAPERR);
- `abrt`: `abort()`, as a failed C++ check or glibc's heap-corruption
  detection ends a process (SIGABRT);
- `bus`: a read of a memory-mapped file that was truncated under the mapping,
  as a checkpoint or dataset read through `mmap` (`torch.load(mmap=True)`,
  safetensors) meets a file shrunk on shared storage (SIGBUS, BUS_ADRERR). The
  mapped file lies in the run's own `_chaos/tmp/`.

The rank records a `crash` event first, naming the signal, so the report
says which crash it was; torchrun's log and the exit status (-11, -6, -7) are
the real ones.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchchaos.faults.contract import FaultKind, FireContext, ResolvedFault
from torchchaos.faults.params import choice
from torchchaos.rundir.layout import RunLayout

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from torchchaos.faults.shape import JobShape

SIGNALS = {"segv": signal.SIGSEGV, "abrt": signal.SIGABRT, "bus": signal.SIGBUS}


class Crash(FaultKind):
    name = "crash"
    summary = ("a native crash inside a rank: a NULL read (SIGSEGV), abort() (SIGABRT) or a"
               " truncated mmap'd file (SIGBUS), made by the rank itself")
    not_on_a_cluster = ("a crash the process makes itself; Chaos Mesh can only kill a pod from "
                        "outside (kill:signal=SIGSEGV comes nearest)")
    targets = ("rank",)
    params = {"signal": choice(tuple(SIGNALS))}
    choices = {"signal": tuple(SIGNALS)}
    marks = ("crash",)

    def strategies(self, shape: JobShape) -> dict[str, SearchStrategy[str] | None]:
        from hypothesis import strategies as st

        return {"crash": st.builds(lambda r, s, sig: f"crash:rank={r},step={s},signal={sig}",
                                   shape.a_rank(), shape.a_step(),
                                   st.sampled_from(list(SIGNALS)))}

    def said(self, event: dict[str, Any]) -> str:
        how = {"SIGSEGV": "a NULL read", "SIGABRT": "abort()", "SIGBUS": "a read of a"
               " truncated mmap'd file"}.get(event.get("signal", ""), "")
        return f"{event.get('signal')} from {how}, made by the rank itself"

    def fire(self, fault: ResolvedFault, ctx: FireContext) -> None:
        how = str(fault.params.get("signal", "segv"))
        step = ctx.step()
        ctx.record("crash", id=fault.id, signal=signal.Signals(SIGNALS[how]).name, step=step)
        if how == "segv":
            ctypes.string_at(0)  # reads address 0: the kernel sends SIGSEGV
        elif how == "abrt":
            os.abort()
        else:
            _read_truncated_mapping(RunLayout(Path(ctx.run_dir)).tmp_dir,
                                    f"crash-bus-{os.getpid()}")
        # not reached: each of the above ends the process
        raise RuntimeError(f"crash:signal={how} did not crash the process")


def _read_truncated_mapping(folder: Path, name: str) -> None:
    """Map a page of a file, shrink the file to nothing, read the page: SIGBUS."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with open(path, "w+b") as f:
        f.truncate(mmap.PAGESIZE)
        mapped = mmap.mmap(f.fileno(), mmap.PAGESIZE)
        f.truncate(0)
        path.unlink()  # the mapping keeps the inode; nothing is left in the folder
        mapped[0]  # no page behind it any more: the kernel sends SIGBUS
