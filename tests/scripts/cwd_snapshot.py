"""A DDP script in the style of PyTorch's torchrun tutorial: `snapshot.pt` in cwd.

Run with ``torchrun --standalone --nproc-per-node 2 cwd_snapshot.py [--steps N]``
from any folder: rank 0 saves the whole training state to ``snapshot.pt`` in
the working directory every ``--every`` steps (a temp name, fsync, os.replace,
fsync of the folder: durable and atomic) and every rank resumes from it when
it is there. A tiny MLP on seeded data over gloo; deterministic on CPU.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

SNAPSHOT = "snapshot.pt"


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Seeded by (step, rank): a resumed run sees the same data.
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(8, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True).cos()


def fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(step: int, model: nn.Module, optim: torch.optim.Optimizer) -> None:
    temp = f"{SNAPSHOT}.tmp"
    torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step,
                "rng": torch.get_rng_state()}, temp)
    fsync_path(temp, os.O_RDONLY)
    os.replace(temp, SNAPSHOT)
    fsync_path(".", os.O_RDONLY | os.O_DIRECTORY)  # the rename itself must be durable


def resume(model: nn.Module, optim: torch.optim.Optimizer) -> int:
    if not os.path.exists(SNAPSHOT):
        return 0
    state = torch.load(SNAPSHOT, weights_only=False)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    model = DistributedDataParallel(net)
    optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = resume(net, optim)
    while step < args.steps:
        step += 1
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step % args.every == 0:
            if rank == 0:
                save(step, net, optim)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
