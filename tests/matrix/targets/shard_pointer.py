"""Click-through MLP trained data-parallel over gloo, with sharded checkpoints.

Written the way a ranking team writes its trainer: no DDP wrapper (gradients
are averaged by hand), every rank draws its own examples and has its own
dropout stream, and every rank writes its own shard file. A checkpoint is
published by rank 0 moving a pointer file, `latest`, once every shard is on
disk:

    <ckpt>/step_00008/rank0.pt   rank 0's replica, optimizer, scheduler, RNGs
    <ckpt>/step_00008/rank1.pt   rank 1's
    <ckpt>/latest                "step_00008"

    torchrun --nproc-per-node 2 shard_pointer.py --ckpt-dir ckpt

Variants with a planted bug (--variant):
  no_dir_fsync   files are fsynced, the folders holding the new names never are
  pointer_first  rank 0 moves `latest` before anybody wrote the shards
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

FEATURES = 24
POOL = 512
VARIANTS = ("correct", "no_dir_fsync", "pointer_first")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardedTrainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.sync_dirs = args.variant != "no_dir_fsync"
        torch.manual_seed(args.seed)  # identical initial weights on every rank
        self.model = nn.Sequential(nn.Linear(FEATURES, 48), nn.ReLU(), nn.Dropout(0.2),
                                   nn.Linear(48, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9,
                                   weight_decay=1e-4)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=3, gamma=0.8)
        pool = torch.Generator().manual_seed(args.seed)
        self.x = torch.randn(POOL, FEATURES, generator=pool)
        teacher = torch.randn(FEATURES, 1, generator=pool)
        self.y = (self.x @ teacher > 0).float()
        # per rank: which rows it draws, and its dropout masks
        self.sampler = torch.Generator().manual_seed(args.seed * 1000 + self.rank)
        torch.manual_seed(args.seed * 1000 + 500 + self.rank)
        self.step = 0

    # -- training -------------------------------------------------------------------

    def train_step(self) -> float:
        rows = torch.randint(0, POOL, (self.args.batch,), generator=self.sampler)
        logits = self.model(self.x[rows])
        loss = F.binary_cross_entropy_with_logits(logits, self.y[rows])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(self.world)
        self.opt.step()
        self.sched.step()
        self.step += 1
        return loss.item()

    # -- checkpoints ----------------------------------------------------------------

    def _pointer(self) -> str:
        return os.path.join(self.args.ckpt_dir, "latest")

    def _move_pointer(self, name: str) -> None:
        tmp = self._pointer() + ".tmp"
        with open(tmp, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._pointer())
        if self.sync_dirs:
            fsync_dir(self.args.ckpt_dir)

    def save(self) -> None:
        name = f"step_{self.step:05d}"
        if self.args.variant == "pointer_first" and self.rank == 0:
            self._move_pointer(name)
        folder = os.path.join(self.args.ckpt_dir, name)
        os.makedirs(folder, exist_ok=True)
        shard = {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "sampler": self.sampler.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        final = os.path.join(folder, f"rank{self.rank}.pt")
        tmp = final + ".tmp"
        with open(tmp, "wb") as f:
            torch.save(shard, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        if self.sync_dirs:
            fsync_dir(folder)
        dist.barrier()  # every shard is on disk
        if self.rank == 0 and self.args.variant != "pointer_first":
            if self.sync_dirs:
                fsync_dir(self.args.ckpt_dir)  # the new step folder's own entry
            self._move_pointer(name)
        dist.barrier()

    def resume(self) -> None:
        if not os.path.exists(self._pointer()):
            return
        with open(self._pointer()) as f:
            name = f.read().strip()
        shard = torch.load(os.path.join(self.args.ckpt_dir, name, f"rank{self.rank}.pt"))
        self.model.load_state_dict(shard["model"])
        self.opt.load_state_dict(shard["optimizer"])
        self.sched.load_state_dict(shard["scheduler"])
        self.sampler.set_state(shard["sampler"])
        torch.set_rng_state(shard["torch_rng"])
        self.step = shard["step"]
        if self.rank == 0:
            print(f"resumed from {name}", flush=True)

    def fit(self) -> None:
        self.resume()
        while self.step < self.args.steps:
            loss = self.train_step()
            if self.rank == 0:
                print(f"step {self.step} loss {loss:.5f}", flush=True)
            if self.step % self.args.save_every == 0:
                self.save()


def make_dir_durable(path: str) -> None:
    """Create `path` (and parents), fsyncing each parent that got a new entry."""
    missing = []
    here = os.path.abspath(path)
    while not os.path.isdir(here):
        missing.append(here)
        here = os.path.dirname(here)
    for folder in reversed(missing):
        os.makedirs(folder, exist_ok=True)
        fsync_dir(os.path.dirname(folder))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", default="ckpt")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--variant", choices=VARIANTS, default="correct")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        if args.variant == "no_dir_fsync":
            os.makedirs(args.ckpt_dir, exist_ok=True)
        else:
            make_dir_durable(args.ckpt_dir)
    dist.barrier()
    ShardedTrainer(args).fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
