"""Small MLP, DDP over gloo, each rank saving its own file into a folder of its own.

The layout of trainers that write per-rank checkpoints without a coordinator: the job
makes `out/rank0/`, `out/rank1/`, ...; at each save every rank writes
`out/rankR/step_N.pt` to a temporary file, fsyncs it, renames it into place and fsyncs
its folder. After a barrier every rank prunes its folder down to the two newest files.
On resume each rank finds its newest file and the ranks agree on the oldest of those
(an all-reduce of the minimum), so a save one rank finished and another did not is
passed over. Each step's batch is drawn from a generator seeded by the step, so a
resume needs no data state.

    torchrun --nproc-per-node 2 rank_folders.py --out out

With --own-path each checkpoint also holds the absolute path of `out/`, and a resume
goes on saving where the checkpoint says it was written (as Lightning's `dirpath` and
nanoGPT's stored config do): a copy of the checkpoints in another folder would resume
into the folder it was copied from.

Variants with a planted bug (--variant):
  no_parent_fsync  the rank folders are made and never made durable in out/ (out/ is
                   not fsynced after the mkdir): a power loss takes every checkpoint
  prune_by_name    prunes before writing, keeping the newest by name order: at the
                   3rd save 'step_10.pt' sorts before 'step_5.pt' and is deleted, so a
                   crash in that save resumes from step 5
"""

from __future__ import annotations

import argparse
import os
import re

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

VARIANTS = ("correct", "no_parent_fsync", "prune_by_name")
FEATURES, CLASSES, BATCH = 12, 4, 8
KEEP = 2


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_rank_folder(out: str, rank: int, variant: str) -> str:
    folder = os.path.join(out, f"rank{rank}")
    if not os.path.isdir(folder):
        os.makedirs(folder)
        if variant != "no_parent_fsync":
            fsync_path(out)  # the new folder's entry in out/ survives a power loss
    return folder


def steps_in(folder: str) -> dict[int, str]:
    found = {}
    for name in os.listdir(folder):
        if m := re.fullmatch(r"step_(\d+)\.pt", name):
            found[int(m.group(1))] = name
    return found


def prune(folder: str, keep: int, by_name: bool) -> None:
    found = steps_in(folder)
    ordered = sorted(found.values()) if by_name else [found[s] for s in sorted(found)]
    for name in ordered[:-keep] if len(ordered) > keep else []:
        os.remove(os.path.join(folder, name))
    fsync_path(folder)


def save(folder: str, step: int, state: dict) -> None:
    tmp = os.path.join(folder, f".step_{step}.pt.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(folder, f"step_{step}.pt"))
    fsync_path(folder)


def agreed_step(folder: str) -> int:
    """The newest step every rank has a file of (0: start afresh)."""
    newest = torch.tensor([max(steps_in(folder), default=0)])
    dist.all_reduce(newest, op=dist.ReduceOp.MIN)
    return int(newest.item())


def batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1000 + step * 10 + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, (x[:, :CLASSES].argmax(dim=1) + step) % CLASSES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out")
    parser.add_argument("--steps", type=int, default=17)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--variant", choices=VARIANTS, default="correct")
    parser.add_argument("--own-path", action="store_true",
                        help="store out/'s absolute path in each checkpoint and go on"
                             " saving there after a resume")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(FEATURES, 24), nn.ReLU(), nn.Linear(24, CLASSES)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    os.makedirs(args.out, exist_ok=True)
    folder = make_rank_folder(args.out, rank, args.variant)

    step = agreed_step(folder)
    if step:
        state = torch.load(os.path.join(folder, f"step_{step}.pt"))
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        if args.own_path:  # save where the checkpoint says the job wrote
            folder = os.path.join(state["out"], f"rank{rank}")
        print(f"rank {rank} resuming from step {step}", flush=True)

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
            if args.variant == "prune_by_name":  # room for the new file, by name order
                prune(folder, KEEP - 1, by_name=True)
            state = {"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                     "step": step}
            if args.own_path:
                state["out"] = os.path.abspath(args.out)
            save(folder, step, state)
            dist.barrier()
            if args.variant != "prune_by_name":
                prune(folder, KEEP, by_name=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
