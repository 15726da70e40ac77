"""torchrun whose ranks are forked from a launcher that has torch imported already.

`python -m torchchaos.rank.warmrun <torchrun options> script.py args` is torchrun
itself (`torch.distributed.run.main`: its elastic agent, rendezvous, monitoring and
restarts) in torchrun's own `--run-path --start-method fork` mode, which runs the
script with `runpy.run_path` in workers forked from the launcher. The launcher imports
what a rank's start-up needs first (torch, and torch._dynamo that
DistributedDataParallel imports), so each rank, and each restart, starts with it
imported: on 2 cores that is 2.3 s of CPU a rank less, per start.

Every job the harness runs starts this way unless the user asks for exec'd ranks
(`TORCHCHAOS_COLD_START=1`, `Job(..., warm=False)`). A forked rank is made to start as
a fresh `python -u script.py` would (`_rank`): default signal handlers, faulthandler
off, no death signal from the launcher, torch's and numpy's global generators seeded
anew, the script's folder first on sys.path, the agent armed, an uncaught exception
printed by sys.excepthook from the script's first frame, the exit code and atexit
handlers as the interpreter's own, and the process gone once the script returns (its
connections closed, as an exec'd rank's exit closes them); and torchrun names the
failed worker a user's torchrun would (`_signalled_first`). What it cannot renew is
the str-hash seed: every rank and restart shares the launcher's, so the harness gives
each job the same one (`PYTHONHASHSEED`, runner.job_environment) and a cold job agrees
with a warm one.
Its exit, like torchrun's, freezes the heap (sitecustomize).
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import importlib
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed.run as torchrun
from torch.distributed.elastic.multiprocessing import api as torchrun_processes

from torchchaos import env
from torchchaos.rank import agent

PR_SET_PDEATHSIG = 1
_INTERRUPTED = object()  # the script ended with an uncaught KeyboardInterrupt
_run_script_path = torchrun.run_script_path  # torchrun's: sys.argv, then runpy.run_path


def main(argv: list[str]) -> None:
    for name in agent.WARM_IMPORTS:
        importlib.import_module(name)
    torchrun.run_script_path = _rank  # looked up when torchrun builds its entry point
    torchrun_processes.MultiprocessContext._poll = _poll_counting_quiet_exits
    torchrun.main(["--run-path", "--start-method", "fork", *argv])


_poll = torchrun_processes.MultiprocessContext._poll


def _poll_counting_quiet_exits(self: torchrun_processes.MultiprocessContext) -> object:
    """torchrun's poll of its forked workers, where a worker that left by os._exit(0)
    has ended well, as an exec'd one would have. torchrun's fork mode counts a worker
    done only once its wrapper sent the function's return value, which neither `_rank`
    (it leaves as soon as the script returns) nor a script that ends with os._exit (the
    bundled target does, to skip a teardown that can hang) lets it send: the launcher
    would wait for it forever."""
    if self._pc is not None:
        _signalled_first(self._pc)
        for local_rank, process in enumerate(self._pc.processes):
            if (process.exitcode == 0 and local_rank not in self._return_values
                    and self._ret_vals[local_rank].empty()):
                self._return_values[local_rank] = None  # what a script's end returns
    return _poll(self)


def _signalled_first(pc: Any) -> None:
    """Have torchrun's poll name the worker a user's torchrun would: of the workers that
    ended since its last poll, the first killed by a signal, else the first in rank
    order. A signal ends a worker at once in either mode, but a worker that exits runs
    its exit path, and an exec'd one's interpreter teardown outlasts a poll where a
    forked one leaves by os._exit: rank 0's echo of rank 1's SIGSEGV ("Connection reset
    by peer", exit 1) was gone by the same poll and named first, in rank order, so the
    log never showed the SIGSEGV. Two workers that both exit (a preemption's 143) stay
    in rank order, as they do in torchrun's subprocess mode. A thread notes when each
    worker ends; torchrun's join looks at them in that order."""
    ended = getattr(pc, "_torchchaos_ended", None)
    if ended is None:
        ended = pc._torchchaos_ended = {}
        threading.Thread(target=_note_ends, args=(pc.processes, ended), daemon=True,
                         name="torchchaos-worker-ends").start()
    if not ended:
        return

    def order(item: tuple[Any, int]) -> tuple[int, float]:
        local_rank = item[1]
        killed = local_rank in ended and (pc.processes[local_rank].exitcode or 0) < 0
        return (0, ended[local_rank]) if killed else (1, local_rank)

    pc.sentinels = dict(sorted(pc.sentinels.items(), key=order))


def _note_ends(processes: list[Any], ended: dict[int, float]) -> None:
    waiting = {process.sentinel: local_rank for local_rank, process in enumerate(processes)}
    try:
        while waiting:
            for sentinel in multiprocessing.connection.wait(list(waiting)):
                ended[waiting.pop(sentinel)] = time.monotonic()
    except (OSError, ValueError):
        return  # torchrun closed the workers' handles: nothing more to order


def _rank(script: str, *args: str) -> None:
    """One rank, in a process just forked from the launcher: run the script as a fresh
    interpreter would, and end as one would."""
    _as_a_fresh_interpreter(script)
    armed = os.environ.get(env.RUN_DIR) and "LOCAL_RANK" in os.environ
    if armed and env.AGENT_PID not in os.environ:
        agent.TEARDOWN_FOLLOWS = False  # this process leaves by os._exit: nothing to lighten
        agent.boot()  # what sitecustomize does in a rank torchrun started with exec
    code: object = 0
    try:
        _run_script_path(script, *args)
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt as exc:
        _print_uncaught(exc, script)
        code = _INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 - printed, then exit code 1, as python does
        _print_uncaught(exc, script)
        code = 1
    shut_down()
    if code is _INTERRUPTED:  # python ends by the signal after a KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    if code not in (0, None):
        raise SystemExit(code)  # torchrun's worker wrapper exits with it
    # torchrun's wrapper of a forked worker waits, once the script returns, until every
    # rank has returned, the rank's sockets still open: a peer that waits to see it go (a
    # barrier that fails once a rank has left, Lightning's on a SIGTERM) hung there, where
    # an exec'd rank's exit lets it go on at once. It leaves now, as that exit does, and
    # torchrun counts it done (_poll_counting_quiet_exits).
    os._exit(0)


def _as_a_fresh_interpreter(script: str) -> None:
    # the launcher's handlers (torchrun's: raise in the agent) are not a rank's
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # torchrun's @record around a forked worker turns faulthandler on (its stacks would
    # tell a crash that an exec'd rank dies of silently); python does only when asked
    if not os.environ.get("PYTHONFAULTHANDLER") and "faulthandler" not in sys._xoptions:
        faulthandler.disable()
    # torch.multiprocessing asks for SIGINT when the launcher dies; an exec'd rank lives on
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    # a fresh interpreter seeds torch's and numpy's global generators from the OS (each
    # rank its own); `random` reseeds itself at fork; CUDA's are made in the rank
    torch.default_generator.seed()
    numpy = sys.modules.get("numpy")  # torch imports it
    if numpy is not None:
        numpy.random.seed()
    sys.path[0] = os.path.dirname(os.path.abspath(script))


def _print_uncaught(exc: BaseException, script: str) -> None:
    """sys.excepthook on the traceback from the script's first frame on, as `python
    script.py` prints it (not from this module's and runpy's frames); and, as python's
    top level does, the exception kept in sys.last_value. Its frames, and what they hold
    (a DDP model, its process group), then live until the process ends by os._exit,
    as in a rank that ends without an error: freed at the end of `except`, a process
    group whose communicator was aborted could hang in its destructor's thread join
    (torch 2.13 gloo, 2 of 30 warm runs of `abort` on plain_ddp.py; 0 of 26 exec'd)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    tb = tb or exc.__traceback__
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)


def shut_down() -> None:
    """The interpreter's own end, which a forked worker skips (it leaves by os._exit):
    join the threads the script left, then the atexit handlers, then flush."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    main(sys.argv[1:])
