"""A small DDP job that fails the way real jobs do, once, for the incident corpus.

Run under plain torchrun (no harness): ``torchrun --nproc-per-node 2 --max-restarts 1
incident_probe.py --fail MODE --rank R --step S``. It trains a linear model over gloo,
prints ``[step N] loss X`` from rank 0, saves ``ckpt/step-N.pt`` every 4 steps (temp file,
fsync, rename) and resumes from the newest on start, like many scripts do. Its errors
are recorded (``@record``: torchelastic's error file), faulthandler is on, and on an
exception it writes its flight-recorder dump (``TORCH_FR_BUFFER_SIZE``) to
``$FR_DUMP<rank>``, as a team that keeps those dumps would. On the first attempt only
(``TORCHELASTIC_RESTART_COUNT`` 0), rank R fails after step S:

- ``raise``: RuntimeError in the training step;
- ``segv`` / ``abort``: a real SIGSEGV (a read of address 1) / ``os.abort()``;
- ``oom``: joins the memory cgroup ``$OOM_CGROUP`` and allocates until the kernel's
  OOM killer ends it;
- ``hang``: sleeps holding nothing, so the peers' next all-reduce times out;
- ``kill`` / ``term``: SIGKILL / SIGTERM to itself;
- ``save``: SIGKILL in the middle of writing the checkpoint of step S (its temp file
  written, not renamed);
- ``load``: the checkpoint of step S is written in place and cut short, the rank dies
  by SIGKILL after it, and the restart's ``torch.load`` raises.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import faulthandler
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

CKPT = "ckpt"
EVERY = 4


def first_attempt() -> bool:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def save(step: int, state: dict, fail_here: str | None) -> None:
    os.makedirs(CKPT, exist_ok=True)
    final = os.path.join(CKPT, f"step-{step:04d}.pt")
    if fail_here == "load":  # in place, and cut short: the bug and the death together
        torch.save(state, final)
        with open(final, "r+b") as f:
            f.truncate(os.path.getsize(final) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    if fail_here == "save":
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace(tmp, final)
    print(f"saved checkpoint {final} at step {step}", flush=True)


def newest() -> str | None:
    if not os.path.isdir(CKPT):
        return None
    found = sorted(n for n in os.listdir(CKPT) if n.endswith(".pt"))
    return os.path.join(CKPT, found[-1]) if found else None


def fail(mode: str) -> None:
    if mode == "raise":
        raise RuntimeError("loss scaler state is inconsistent")
    if mode == "segv":
        ctypes.string_at(1)
    if mode == "abort":
        os.abort()
    if mode == "oom":
        with open(os.path.join(os.environ["OOM_CGROUP"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        hog = []
        while True:
            hog.append(bytearray(64 << 20))
    if mode == "hang":
        time.sleep(3600)
    if mode in ("kill", "term"):
        os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGTERM)
        time.sleep(60)


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", default="none")
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--step", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12)
    ns = parser.parse_args()
    faulthandler.enable()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    path = newest()
    if path:
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = state["step"]
        if rank == 0:
            print(f"resumed from {path} at step {start}", flush=True)
    failing = first_attempt() and ns.fail != "none" and rank == ns.rank
    try:
        for step in range(start + 1, ns.steps + 1):
            gen = torch.Generator().manual_seed(step * 10 + rank)
            x = torch.randn(16, 8, generator=gen)
            loss = model(x).pow(2).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            if rank == 0:
                print(f"[step {step}] loss {loss.item():.4f}", flush=True)
            if failing and step == ns.step and ns.fail not in ("save", "load"):
                fail(ns.fail)
            if step % EVERY == 0:
                dist.barrier()
                if rank == ns.rank or rank == 0:
                    here = ns.fail if failing and step == ns.step else None
                    if rank == 0:
                        save(step, {"model": model.state_dict(), "optim": optim.state_dict(),
                                    "step": step}, here if rank == ns.rank else None)
                    elif here:
                        os.kill(os.getpid(), signal.SIGKILL)
                dist.barrier()
    except Exception:
        dump = os.environ.get("FR_DUMP")
        if dump and os.environ.get("TORCH_FR_BUFFER_SIZE"):
            with open(f"{dump}{rank}", "wb") as f:
                f.write(torch._C._distributed_c10d._dump_fr_trace())
        raise
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
