#!/usr/bin/env python
"""Toy regression trainer. Keeps ckpt/latest.txt pointing at the newest checkpoint."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--save-every", type=int, default=25)
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--sleep", type=float, default=0.08)
    return p.parse_args()


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh()) for _ in range(6)])
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    os.makedirs(args.ckpt_dir, exist_ok=True)

    start = 0
    ptr = os.path.join(args.ckpt_dir, "latest.txt")
    if os.path.exists(ptr):
        name = open(ptr).read().strip()
        print(f"rank {rank}: resuming from {name}", flush=True)
        state = torch.load(os.path.join(args.ckpt_dir, name), map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"rank {rank}: resumed at step {start}", flush=True)

    g = torch.Generator().manual_seed(1234 + rank)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(16, args.width, generator=g)
        loss = (ddp(x) - x.flip(1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        if step % args.save_every == 0:
            if rank == 0:
                name = f"ckpt_{step:06d}.pt"
                # point at the new file first, then write it
                with open(ptr, "w") as f:
                    f.write(name + "\n")
                print(f"saving {name}", flush=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                           os.path.join(args.ckpt_dir, name))
                print(f"saved {name}", flush=True)
            dist.barrier()
        time.sleep(args.sleep)

    if rank == 0:
        print("training done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
