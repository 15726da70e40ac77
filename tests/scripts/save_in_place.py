"""A DDP script that overwrites its only checkpoint in place: ``torch.save(ckpt, path)``.

The common shortcut: no temp file, no rename, one ``out/ckpt.pt`` rewritten at
every save by torch's C++ writer, and resume loads it if it is there. A kill
during the save leaves a torn file that resume then fails to read.

Run with ``torchrun --standalone --nproc-per-node 2 save_in_place.py [--steps N]
[--ckpt-every K]`` from a run directory. Deterministic on CPU; knows nothing
about any harness.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CKPT = os.path.join("out", "ckpt.pt")


def make_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Seeded by (step, rank) so a resumed run sees the same data.
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def resume(model: nn.Module, optim: torch.optim.Optimizer) -> int:
    if not os.path.exists(CKPT):
        return 0
    state = torch.load(CKPT, weights_only=True)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    return int(state["step"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--ckpt-every", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    os.makedirs("out", exist_ok=True)
    # Large enough that the file is written in many pieces (not one small write).
    net = nn.Sequential(nn.Linear(8, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                        nn.Linear(256, 1))
    model = DistributedDataParallel(net)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    step = resume(net, optim)
    while step < args.steps:
        step += 1
        x, y = make_batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step % args.ckpt_every == 0:
            if rank == 0:
                state = {"model": net.state_dict(), "optim": optim.state_dict(), "step": step}
                torch.save(state, CKPT)  # in place, by path: the C++ writer
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
