"""A DDP trainer that keeps one file per checkpoint and a pointer to the newest.

    torchrun --nproc_per_node 2 pointer_trainer.py OUT [--steps 40] [--save-every 10]
        [--size-mb 8] [--pointer-first]

Rank 0 writes OUT/ckpt/model_<step>.pt with torch.save and then OUT/ckpt/latest.txt
naming it; a relaunch reads latest.txt and resumes from the file it names.

`--pointer-first` is the bug users bring: the pointer is moved before the file is
written, and the file is written in place, so a death inside the save leaves the
pointer naming a file cut short, and the resume dies loading it. Without it the save
is the atomic one: a temporary file, fsynced, renamed into place, the folder fsynced,
and only then the pointer, by the same protocol.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--size-mb", type=float, default=8.0, help="the checkpoint's size")
    p.add_argument("--pointer-first", action="store_true")
    return p.parse_args()


def fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, write) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_folder(os.path.dirname(path))


def save(ckpt: str, step: int, state: dict, pointer_first: bool) -> None:
    name = f"model_{step:06d}.pt"
    pointer = os.path.join(ckpt, "latest.txt")
    if pointer_first:
        with open(pointer, "w") as f:
            f.write(name + "\n")
        torch.save(state, os.path.join(ckpt, name))
    else:
        write_atomically(os.path.join(ckpt, name), lambda f: torch.save(state, f))
        write_atomically(pointer, lambda f: f.write((name + "\n").encode()))
    print(f"saved {name} at step {step}", flush=True)


def resume(ckpt: str, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    pointer = os.path.join(ckpt, "latest.txt")
    if not os.path.exists(pointer):
        return 0
    with open(pointer) as f:
        name = f.read().strip()
    state = torch.load(os.path.join(ckpt, name), weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    print(f"resumed from {name} at step {state['step']}", flush=True)
    return int(state["step"])


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    width = max(8, int((args.size_mb * 2**20 / 4 / 3) ** 0.5))  # weights + Adam's two
    model = nn.Linear(width, width, bias=False)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    ckpt = os.path.join(args.out, "ckpt")
    os.makedirs(ckpt, exist_ok=True)
    step = resume(ckpt, model, opt)
    while step < args.steps:
        # each step's batch is the step's own: a resume is given the batches it would have had
        gen = torch.Generator().manual_seed(rank * 1_000_003 + step)
        x = torch.randn(4, width, generator=gen)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
        if step % args.save_every == 0:
            if rank == 0:
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
                save(ckpt, step, state, args.pointer_first)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
