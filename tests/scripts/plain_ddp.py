"""A plain DDP training script that has never heard of torchchaos.

The kind of script users bring: an MLP on synthetic data, SGD with momentum,
a checkpoint every 5 steps (temp file + os.replace), resume from the newest.
Used by the tests to show the agent instruments and judges it unchanged.
"""

import glob
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS, EVERY = 30, 5


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(16, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    os.makedirs("ckpt", exist_ok=True)
    start = 0
    found = sorted(glob.glob("ckpt/step-*.pt"))
    if found:
        state = torch.load(found[-1])
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["rng"])
        start = state["step"]
    for step in range(start + 1, STEPS + 1):
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % EVERY == 0 and rank == 0:
            state = {"model": model.state_dict(), "opt": opt.state_dict(),
                     "rng": torch.get_rng_state(), "step": step}
            torch.save(state, "ckpt/tmp.pt")
            os.replace("ckpt/tmp.pt", f"ckpt/step-{step:04d}.pt")
        if step % EVERY == 0:
            dist.barrier()
    if rank == 0:
        print(f"done step {STEPS} loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
