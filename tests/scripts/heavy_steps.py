"""A 2-rank DDP trainer whose every step costs about a second of CPU, as a real model's
step does on CPU, knowing nothing about any chaos harness.

Each step first prepares its batch the way a data pipeline that decodes and augments
does: CPU work (`--work` seconds of this process's CPU time, matrix products whose
results are thrown away), then the batch itself, drawn from a generator seeded by
(step, rank), so the training is the same however long the work took. On a loaded
machine the step takes several times `--work` in wall time. It saves `ckpt/latest.pt`
every 2 steps (temporary file, then os.replace) and resumes from it.

    torchrun --standalone --nproc-per-node 2 heavy_steps.py --steps 4 --work 1.2
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CKPT = os.path.join("ckpt", "latest.pt")


def burn(seconds: float) -> None:
    """`seconds` of this process's CPU time, whatever the machine's load."""
    a = torch.ones(256, 256)
    end = time.process_time() + seconds
    while time.process_time() < end:
        a = (a @ a).clamp_(-1.0, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--work", type=float, default=1.2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.Tanh(),
                                                  nn.Linear(32, 1)))
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    if os.path.exists(CKPT):
        state = torch.load(CKPT, weights_only=True)
        model.module.load_state_dict(state["model"])
        step = int(state["step"])
        print(f"resumed from {CKPT} at step {step}", flush=True)
    while step < args.steps:
        burn(args.work)
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(64, 16, generator=gen)
        loss = (model(x) - x.sum(dim=1, keepdim=True).sin()).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        step += 1
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % 2 == 0:
            if rank == 0:
                os.makedirs("ckpt", exist_ok=True)
                torch.save({"model": model.module.state_dict(), "step": step}, CKPT + ".tmp")
                os.replace(CKPT + ".tmp", CKPT)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
