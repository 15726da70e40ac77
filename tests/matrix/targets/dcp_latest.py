"""Small MLP, DDP over gloo, saved with DCP's async_save and published by a `latest` symlink.

The layout of research trainers built on torch.distributed.checkpoint: each save is a
DCP folder `<ckpt>/step_N/` (one `__R_0.distcp` per rank and DCP's `.metadata`),
written by `dcp.async_save` while training goes on; the model and optimizer go
through `get_state_dict` / `set_state_dict` (a fresh optimizer has no momentum to
load into). The next save (and the end of training) waits for that future; then
rank 0 fsyncs `.metadata` (DCP fsyncs its file object before pickle's buffered
bytes reach it), `step_N/` and `<ckpt>/`, and points `<ckpt>/latest` at it: a new
symlink made beside it and renamed over it, and the folder fsynced again. A
resume loads `<ckpt>/latest` when it exists. The batches come from a generator
seeded by the step; the RNG state the dropout draws from is saved by every rank
under a key of its own.

    torchrun --nproc-per-node 2 dcp_latest.py --ckpt checkpoints

Variants with a planted bug (--variant):
  early_latest  `latest` is moved to step_N when its async save starts, before a byte
                of it is written (KempnerForge#102's shape): a failure in the save
                leaves `latest` naming a folder without `.metadata`
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

VARIANTS = ("correct", "early_latest")
FEATURES, CLASSES, BATCH = 12, 4, 8


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def point_latest(ckpt: str, step: int) -> None:
    """Swap `latest` to step_N in one rename, then make the swap durable."""
    tmp = os.path.join(ckpt, "latest.tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(f"step_{step}", tmp)
    os.replace(tmp, os.path.join(ckpt, "latest"))
    fsync_path(ckpt)


def batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1000 + step * 10 + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, (x[:, :CLASSES].argmax(dim=1) + step) % CLASSES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", default="checkpoints")
    parser.add_argument("--steps", type=int, default=17)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--variant", choices=VARIANTS, default="correct")
    args = parser.parse_args()

    torch.set_num_threads(1)
    timeout = timedelta(seconds=5)  # a peer that stops fails the next collective
    dist.init_process_group(backend="gloo", timeout=timeout)
    rank = dist.get_rank()
    # DCP's collectives apart from training's, with the same timeout (a new group's
    # default is torch's 30 minutes, whatever init_process_group was given)
    save_group = dist.new_group(backend="gloo", timeout=timeout)
    torch.manual_seed(args.seed + rank)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(FEATURES, 24), nn.ReLU(), nn.Dropout(0.2), nn.Linear(24, CLASSES)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    os.makedirs(args.ckpt, exist_ok=True)
    rng_key = f"rng_{rank}"

    def state(step: int) -> dict:
        weights, optim = get_state_dict(model, opt)
        return {"model": weights, "optim": optim, "step": torch.tensor(step),
                rng_key: torch.get_rng_state()}

    step = 0
    latest = os.path.join(args.ckpt, "latest")
    if os.path.exists(latest):
        loaded = state(0)
        dcp.load(loaded, checkpoint_id=latest, process_group=save_group)
        set_state_dict(model, opt, model_state_dict=loaded["model"],
                       optim_state_dict=loaded["optim"])
        torch.set_rng_state(loaded[rng_key])
        step = int(loaded["step"])
        print(f"rank {rank} resumed from {os.readlink(latest)} at step {step}", flush=True)

    pending: tuple[int, object] | None = None

    def publish() -> None:
        nonlocal pending
        if pending is None:
            return
        saved, future = pending
        future.result()
        pending = None
        dist.barrier()
        if rank == 0 and args.variant == "correct":
            folder = os.path.join(args.ckpt, f"step_{saved}")
            fsync_path(os.path.join(folder, ".metadata"))
            fsync_path(folder)
            fsync_path(args.ckpt)
            point_latest(args.ckpt, saved)

    while step < args.steps:
        x, y = batch(args.seed, step, rank)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.save_every == 0:
            publish()
            if rank == 0 and args.variant == "early_latest":
                point_latest(args.ckpt, step)
            future = dcp.async_save(state(step), checkpoint_id=os.path.join(
                args.ckpt, f"step_{step}"), process_group=save_group)
            pending = (step, future)
    publish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
