"""DDP trainer with structured (JSON-lines) logging, atomic checkpoints and resume.

Written apart, as the third held-out target of the incident import (issue 38): by a
helper that did not read the import's readers, in the manner of a platform whose logs
go to a log store. Scored blind before any fix (bench/README.md, 2026-11-28, fifth
session): 5 of 20 exact and 5 wrong guesses.

Launch: ``torchrun --nproc-per-node 2 jsonlog_trainer.py --steps 20 --ckpt-every 5``.
Runs on CPU with the gloo backend. Every log record is one JSON object on one line of
stdout, written with a single ``os.write`` so records from different ranks never
interleave. Fields always present: ``ts`` (UTC, ISO 8601, ms), ``level``, ``rank``,
``event``. Events (and which ranks emit them):

- ``run_start`` (every rank): world_size, steps, ckpt_every, ckpt_dir, params, pid.
- ``ckpt_not_found`` (rank 0): no ``ckpt-*.pt`` in ckpt_dir, training starts at step 0.
- ``ckpt_resume`` (every rank): path, step (the step the checkpoint holds; training
  continues with step + 1).
- ``train_step`` (rank 0 only, every step): step, loss (mean over ranks), lr.
- ``ckpt_save_begin`` / ``ckpt_save_end`` (rank 0): path, step; the end record adds
  bytes, duration_s and the pruned files.
- ``sigterm`` (level warning, the rank that caught it): step (the last one that rank
  completed); then exit status 143.
- ``run_end`` (every rank): step, loss, duration_s.

Checkpoints ``<ckpt_dir>/ckpt-<step:06d>.pt`` hold model, optimizer and step, are written
by rank 0 via temp file + fsync + os.replace + directory fsync, and the newest 3 are kept.
Batches are seeded from (seed, step, rank), so a resumed run sees the same data.
Exceptions are not caught: they reach stderr as ordinary tracebacks.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import signal
import sys
import time
from datetime import UTC, datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

DIM, HIDDEN, BATCH, KEEP = 128, 256, 32, 3
RANK = int(os.environ.get("RANK", "0"))
STATE = {"step": 0}  # read by the SIGTERM handler


def log(event: str, level: str = "info", **fields: object) -> None:
    """Write one JSON record as one line to fd 1 in a single syscall."""
    ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    record = {"ts": ts, "level": level, "rank": RANK, "event": event, **fields}
    data = (json.dumps(record) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def on_sigterm(signum: int, frame: object) -> None:
    log("sigterm", level="warning", step=STATE["step"], signal=signum, exit_code=143)
    sys.exit(143)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="train until this step")
    p.add_argument("--ckpt-every", type=int, default=5, metavar="K")
    p.add_argument("--ckpt-dir", default="ckpts", help="relative to the working directory")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=5, help="linear LR warmup steps")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)  # identical initial weights on every rank
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN),
                         nn.GELU(), nn.Linear(HIDDEN, DIM))


def make_batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch that depends only on (seed, step, rank)."""
    teacher = torch.Generator().manual_seed(seed + 7919)
    w = torch.randn(DIM, DIM, generator=teacher) / DIM**0.5
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + rank)
    x = torch.randn(BATCH, DIM, generator=g)
    return x, torch.tanh(x @ w)


def lr_at(args: argparse.Namespace, step: int) -> float:
    return args.lr * min(1.0, step / max(1, args.warmup))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_ckpts(ckpt_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(ckpt_dir, "ckpt-[0-9]*.pt")))


def save_ckpt(args: argparse.Namespace, model: nn.Module, optim: torch.optim.Optimizer,
              step: int) -> None:
    """Rank 0 writes atomically; every rank then waits at the barrier."""
    if RANK == 0:
        path = os.path.join(args.ckpt_dir, f"ckpt-{step:06d}.pt")
        log("ckpt_save_begin", path=path, step=step)
        t0, tmp = time.monotonic(), path + ".tmp"
        state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step}
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(args.ckpt_dir)
        pruned = list_ckpts(args.ckpt_dir)[:-KEEP]
        for old in pruned:
            os.remove(old)
        if pruned:
            fsync_dir(args.ckpt_dir)
        log("ckpt_save_end", path=path, step=step, bytes=os.path.getsize(path),
            duration_s=round(time.monotonic() - t0, 4), pruned=pruned)
    dist.barrier()


def maybe_resume(args: argparse.Namespace, model: nn.Module,
                 optim: torch.optim.Optimizer) -> int:
    """Rank 0 picks the newest checkpoint and tells the others, so all load the same one."""
    choice = [list_ckpts(args.ckpt_dir)[-1] if RANK == 0 and list_ckpts(args.ckpt_dir)
              else None]
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        if RANK == 0:
            log("ckpt_not_found", ckpt_dir=args.ckpt_dir, step=0)
        return 0
    state = torch.load(choice[0], map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    log("ckpt_resume", path=choice[0], step=state["step"])
    return int(state["step"])


def main() -> None:
    signal.signal(signal.SIGTERM, on_sigterm)
    args = parse_args()
    t_start = time.monotonic()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if RANK == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)
    dist.barrier()
    inner = make_model(args.seed)
    model = DistributedDataParallel(inner)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    log("run_start", world_size=world, steps=args.steps, ckpt_every=args.ckpt_every,
        ckpt_dir=args.ckpt_dir, cwd=os.getcwd(), backend="gloo", pid=os.getpid(),
        params=sum(p.numel() for p in inner.parameters()), torch=torch.__version__)
    step = STATE["step"] = maybe_resume(args, inner, optim)
    loss_val: float | None = None  # None (JSON null) until a step ran here, or if non-finite
    while step < args.steps:
        step += 1
        lr = lr_at(args, step)
        for group in optim.param_groups:
            group["lr"] = lr
        x, y = make_batch(args.seed, step, RANK)
        loss = nn.functional.mse_loss(model(x), y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean_loss = mean.item() / world
        loss_val = round(mean_loss, 8) if math.isfinite(mean_loss) else None
        STATE["step"] = step
        if RANK == 0:
            log("train_step", step=step, loss=loss_val, lr=lr)
        if args.ckpt_every > 0 and step % args.ckpt_every == 0:
            save_ckpt(args, inner, optim, step)
    log("run_end", step=step, loss=loss_val,
        duration_s=round(time.monotonic() - t_start, 3))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
