"""Process life of a reference target under torchrun: set-up, preemption, exit.

Shared by both reference targets (imported as a sibling module).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

import torch
import torch.distributed as dist


def init_distributed(timeout_s: float | None, backend: str | None = None) -> torch.device:
    """Deterministic kernels, one CPU thread, this rank's device, the process group.

    `timeout_s` bounds every collective (None: torch's defaults, 30 min for gloo and
    10 min for NCCL). On GPUs it also arms NCCL's watchdog: a timed-out collective
    aborts the communicator and ends the process instead of leaving it waiting, and a
    watchdog thread that itself stops beating kills the process."""
    # cuBLAS reads this when its first handle is created; it must be set before
    # any CUDA work to make GEMMs deterministic.
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cuda = torch.cuda.is_available()
    # more ranks than GPUs share them (only over gloo: NCCL refuses a shared device)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = backend or ("nccl" if cuda else "gloo")
    if timeout_s is None:
        dist.init_process_group(backend)
        return device
    if cuda:  # read when the NCCL process group is made
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        os.environ.setdefault("TORCH_NCCL_ENABLE_MONITORING", "1")
        os.environ.setdefault("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", str(int(2 * timeout_s) + 1))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return device


class StepWatchdog:
    """Exit (status 1, after dumping every thread's stack) when a step overruns.

    faulthandler's timer runs on its own C thread, so it fires even while the main
    thread is stuck in native code holding the GIL, where a Python thread could not."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step_begins(self) -> None:
        if self.seconds > 0:
            faulthandler.dump_traceback_later(self.seconds, exit=True)

    @staticmethod
    def cancel() -> None:
        faulthandler.cancel_dump_traceback_later()


def collective_timeout(args: argparse.Namespace) -> float | None:
    return None if args.default_timeouts else args.timeout


def step_watchdog(args: argparse.Namespace) -> StepWatchdog:
    return StepWatchdog(0.0 if args.default_timeouts else args.watchdog)


class Preemption:
    """SIGTERM only sets a flag: saving inside a signal handler is unsafe."""

    def __init__(self, grace: int) -> None:
        self.requested = False
        self.grace = grace
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if not self.requested:
            # If the checkpoint cannot finish in time, SIGALRM kills us anyway.
            signal.alarm(self.grace)
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        # Every rank must take the same branch or the next collective hangs.
        flag = torch.tensor([float(self.requested)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def finish(code: int, message: str, grace: int) -> NoReturn:
    """Print, tear down the process group and exit with `code`, skipping teardown.

    Interpreter teardown (or just returning from main) frees the DDP reducer,
    whose gloo process group then joins its worker threads while holding the
    GIL; a worker still freeing the last collective's tensor needs the GIL, so
    both wait forever. That hang was seen here, so never free them: os._exit.
    """
    # Last-resort watchdog: a stuck destroy must not turn into a hung job.
    StepWatchdog.cancel()
    signal.alarm(grace)
    if dist.get_rank() == 0:
        print(message, flush=True)
    dist.destroy_process_group()
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(main: Callable[[], None]) -> NoReturn:
    """Run `main`; an exception prints its traceback and exits 1 (torchrun restarts)."""
    try:
        main()
    except Exception:
        # through sys.excepthook, as an uncaught exception would be: once the process
        # group is up, torch's hook tags each line with the rank ("[rank1]: ..."), which
        # is how a log (and `torchchaos incident import`) tells whose error it was
        sys.excepthook(*sys.exc_info())
        # The traceback still holds main's frame, so this exit frees nothing.
        exit_now(1)
    exit_now(0)
