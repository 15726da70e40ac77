"""A DDP job that stages checkpoints on node-local disk before uploading them.

Run with ``torchrun --nproc-per-node N local_staging_ddp.py`` (gloo, CPU). It
trains a small MLP on synthetic data seeded per step. Every ``--ckpt-every``
steps rank 0 saves ``<local-dir>/ckpt_<step>.pt`` on fast node-local scratch,
then uploads it to the shared ``<ckpt>/ckpt_<step>.pt`` and records its name in
``<ckpt>/latest.txt``. On start every rank resumes from ``latest.txt``.
``--commit-early`` uses the deferred-upload design: ``latest.txt`` is updated
at once and the upload happens at the next checkpoint (or at the end, or when the
job starts again and finds the upload it had not finished).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--ckpt-every", type=int, default=4)
    p.add_argument("--ckpt", default="ckpt", help="shared checkpoint directory")
    p.add_argument("--local-dir", default="/local", help="node-local scratch")
    p.add_argument("--commit-early", action="store_true")
    p.add_argument("--sleep", type=float, default=0.2, help="seconds per step")
    return p.parse_args()


def make_batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    # The global batch depends only on the step; each rank takes its shard.
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16 * world, 8, generator=g)[rank * 16 : (rank + 1) * 16]
    return x, x.sum(dim=1, keepdim=True).sin()


def write_durably(dst: str, data: bytes) -> None:
    """Write ``data`` to ``dst`` via a temp file, fsync and os.replace."""
    with open(dst + ".tmp", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(dst + ".tmp", dst)


def upload(args: argparse.Namespace, name: str) -> None:  # local scratch -> shared dir
    with open(os.path.join(args.local_dir, name), "rb") as f:
        write_durably(os.path.join(args.ckpt, name), f.read())


def commit(args: argparse.Namespace, name: str) -> None:  # record the newest checkpoint
    write_durably(os.path.join(args.ckpt, "latest.txt"), (name + "\n").encode())


def save_local(args: argparse.Namespace, step: int, net: nn.Module, optim: Optimizer) -> str:
    name = f"ckpt_{step}.pt"
    path = os.path.join(args.local_dir, name)
    state = {"model": net.state_dict(), "optim": optim.state_dict(), "step": step}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)
    return name


def finish_pending_upload(args: argparse.Namespace) -> None:
    """A restart ships the checkpoint the last run recorded but had not uploaded yet."""
    latest = os.path.join(args.ckpt, "latest.txt")
    if not os.path.exists(latest):
        return
    with open(latest) as f:
        name = f.read().strip()
    staged = os.path.join(args.local_dir, name)
    if not os.path.exists(os.path.join(args.ckpt, name)) and os.path.exists(staged):
        upload(args, name)


def resume(args: argparse.Namespace, model: nn.Module, optim: Optimizer) -> int:
    latest = os.path.join(args.ckpt, "latest.txt")
    if not os.path.exists(latest):
        return 0
    with open(latest) as f:
        name = f.read().strip()
    state = torch.load(os.path.join(args.ckpt, name), map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    print(f"rank {dist.get_rank()} resumed from {name}", flush=True)
    return state["step"]


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if rank == 0:
        os.makedirs(args.ckpt, exist_ok=True)
        os.makedirs(args.local_dir, exist_ok=True)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optim = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    if rank == 0 and args.commit_early:
        finish_pending_upload(args)
    dist.barrier()
    start = resume(args, net, optim) + 1
    model = DistributedDataParallel(net)
    pending = None  # local checkpoint not yet uploaded (deferred-upload design)
    for step in range(start, args.steps + 1):
        x, y = make_batch(step, rank, world)
        optim.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.ckpt_every == 0:
            if rank == 0:
                if args.commit_early:
                    # Deferred upload: publish now, ship the file with the next save.
                    if pending is not None:
                        upload(args, pending)
                    pending = save_local(args, step, net, optim)
                    commit(args, pending)
                else:
                    name = save_local(args, step, net, optim)
                    upload(args, name)
                    commit(args, name)
            dist.barrier()
        time.sleep(args.sleep)
    if rank == 0 and pending is not None:
        upload(args, pending)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
