"""A 2-rank DDP trainer whose model takes seconds to build, as a real one does.

Written the way a team with a bigger model writes it, independent of the bundled
target: the model (a stack of wide linear layers) is initialised with orthogonal
matrices, layer by layer, before DDP wraps it; that start-up, not the steps, is most
of a short run on CPU. It trains on synthetic data over gloo and checkpoints every
`--save-every` steps to `{ckpt_dir}/latest.pt` (rank 0 writes a temporary file and
renames it), resuming from it on start.

    torchrun --standalone --nproc-per-node 2 slow_build.py --steps 20 --save-every 5
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def build(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layer = nn.Linear(width, width)
        nn.init.orthogonal_(layer.weight)  # a QR per layer: the slow part of start-up
        layers += [layer, nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--ckpt-dir", default="checkpoints")
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--depth", type=int, default=24)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    began = time.monotonic()
    model = build(args.width, args.depth)
    if rank == 0:
        print(f"model built in {time.monotonic() - began:.1f} s", flush=True)
    ddp = DistributedDataParallel(model)
    optim = torch.optim.AdamW(ddp.parameters(), lr=1e-4)

    path = os.path.join(args.ckpt_dir, "latest.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        step = int(state["step"])
    os.makedirs(args.ckpt_dir, exist_ok=True)

    while step < args.steps:
        step += 1
        gen = torch.Generator().manual_seed(step * 10 + rank)
        x = torch.randn(8, args.width, generator=gen)
        loss = ddp(x).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step % args.save_every == 0 and rank == 0:
            torch.save({"model": model.state_dict(), "optim": optim.state_dict(),
                        "step": step}, path + ".tmp")
            os.replace(path + ".tmp", path)
        if step % args.save_every == 0:
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
