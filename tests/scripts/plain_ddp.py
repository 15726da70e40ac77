"""A plain DDP training script that knows nothing about any chaos harness.

Run with ``torchrun --standalone --nproc-per-node 2 plain_ddp.py`` from a run
directory. It trains an MLP on synthetic data with SGD + momentum over gloo for
30 steps, saves ``ckpt/step-NNNN.pt`` every 5 steps (temp file + os.replace) and
resumes from the newest checkpoint on start. Deterministic on CPU.
``--closure`` steps the optimizer as ``optim.step(closure)``, the closure running
the forward and backward (LBFGS style, and how Lightning steps).
``--zero-loss`` multiplies the loss by 0, a slip that leaves the weights as they are.
``--hang-at-exit`` leaves a non-daemon thread running once training is over (an
uploader or logger nobody stops): the interpreter waits for it at exit, forever.
``--no-destroy`` ends without destroy_process_group().
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS, CKPT_EVERY, CKPT_DIR = 30, 5, "ckpt"


def make_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Seeded by (step, rank) so a resumed run sees the same data.
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def save(step: int, model: nn.Module, optim: torch.optim.Optimizer) -> None:
    state = {
        "model": model.state_dict(),
        "optim": optim.state_dict(),
        "step": step,
        # All ranks seed alike and draw alike, so rank 0's RNG stands for all.
        "rng": torch.get_rng_state(),
    }
    path = os.path.join(CKPT_DIR, f"step-{step:04d}.pt")
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def resume(model: nn.Module, optim: torch.optim.Optimizer) -> int:
    found = sorted(glob.glob(os.path.join(CKPT_DIR, "step-*.pt")))
    if not found:
        return 0
    state = torch.load(found[-1], weights_only=False)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng"])
    print(f"rank {dist.get_rank()} resumed from {found[-1]}", flush=True)
    return state["step"]


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    os.makedirs(CKPT_DIR, exist_ok=True)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    model = DistributedDataParallel(net)
    optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = resume(net, optim)
    loss = torch.tensor(float("nan"))
    while step < STEPS:
        step += 1
        x, y = make_batch(step, rank)

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            optim.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            if "--zero-loss" in sys.argv:
                loss = loss * 0
            loss.backward()
            return loss

        if "--closure" in sys.argv:
            loss = optim.step(closure)
        else:
            loss = closure()
            optim.step()
        if step % CKPT_EVERY == 0:
            if rank == 0:
                save(step, net, optim)
            dist.barrier()
    if rank == 0:
        print(f"done step {step} loss {loss.item()!r}", flush=True)
    if "--no-destroy" not in sys.argv:
        dist.destroy_process_group()
    if "--hang-at-exit" in sys.argv:
        threading.Thread(target=time.sleep, args=(3600,), name="uploader").start()


if __name__ == "__main__":
    main()
