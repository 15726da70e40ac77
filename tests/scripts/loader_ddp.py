"""An epoch-based DDP classifier written the way many research repositories are.

Knows nothing about any chaos harness. A synthetic classification set behind a
`DistributedSampler` and a `DataLoader` with 2 worker processes (persistent);
an MLP, Adam; rank 0 saves `checkpoints/last.pt` every `--save-every` steps
through a temp file and `os.replace`, inside a `try/except` that prints a
warning and trains on when the save fails ("a failed save must not kill a
week-long run"). On start every rank loads `last.pt` if it exists and skips
the batches of the epoch it already trained, by counting them off the loader.

    torchrun --standalone --nproc-per-node 2 loader_ddp.py [--steps 24] [--save-every 4]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CKPT = os.path.join("checkpoints", "last.pt")


def make_data(n: int = 512) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def save(model: nn.Module, optim: torch.optim.Optimizer, epoch: int, step: int) -> None:
    os.makedirs("checkpoints", exist_ok=True)
    tmp = CKPT + ".tmp"
    try:
        torch.save({"model": model.state_dict(), "optim": optim.state_dict(),
                    "epoch": epoch, "step": step}, tmp)
        os.replace(tmp, CKPT)
    except Exception as exc:  # noqa: BLE001 - the pattern this script stands for
        print(f"WARNING: checkpoint at step {step} failed ({exc}); continuing", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=0.0)  # a slower model's step
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(),
                                                  nn.Linear(32, 2)))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = make_data()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    per_epoch = len(loader)

    epoch, step = 0, 0
    if os.path.exists(CKPT):
        state = torch.load(CKPT, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        epoch, step = state["epoch"], state["step"]
        print(f"resumed from {CKPT} at step {step}", flush=True)

    while step < args.steps:
        sampler.set_epoch(epoch)
        skip = step - epoch * per_epoch  # batches of this epoch already trained
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            loss = nn.functional.cross_entropy(model(x), y)
            optim.zero_grad()
            loss.backward()
            optim.step()
            time.sleep(args.step_seconds)
            step += 1
            if dist.get_rank() == 0 and step % args.save_every == 0:
                save(model.module, optim, epoch, step)
            if step >= args.steps:
                break
        else:
            epoch += 1
        dist.barrier()
    if dist.get_rank() == 0:
        print(f"done at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
