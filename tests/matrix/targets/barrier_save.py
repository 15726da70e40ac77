"""Small MLP, DDP over gloo, a recipe class whose synchronous save meets at barriers and
publishes a `LATEST` symlink.

The layout of recipe-style trainers (a `Recipe` object that owns the model, the
optimizer, the schedule and the data position, and a `save_checkpoint` method): a save
makes `<dir>/epoch_0_step_N/`, every rank writes `model/shard-R.pt` and
`optim/shard-R.pt` there (temporary name, fsync, rename), the ranks meet at a barrier,
rank 0 writes `config.json` with the step, fsyncs the folders and swaps `<dir>/LATEST`
to the new folder (a symlink made beside it and renamed over it, then the folder
fsynced), and the ranks meet again before training goes on. A resume loads what
`LATEST` names.

Collectives time out after --timeout seconds: a rank that stops in the save fails its
peers' barrier, and torchrun restarts the job.

    torchrun --nproc-per-node 2 barrier_save.py --checkpoint-dir checkpoints

Variants with a planted bug (--variant):
  no_timeout  torch's default collective timeout (30 minutes on gloo): a rank stopped
              inside the save holds its peer at the save's barrier (NeMo AutoModel#3254)
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

VARIANTS = ("correct", "no_timeout")
FEATURES, CLASSES, BATCH = 12, 4, 8


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(obj: object, path: str) -> None:
    with open(path + ".tmp", "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


class Recipe:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank()
        torch.manual_seed(args.seed)
        self.model = DistributedDataParallel(nn.Sequential(
            nn.Linear(FEATURES, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, CLASSES)))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: 1.0 / (1.0 + 0.1 * step))
        self.step = 0

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.args.seed * 1000 + self.step * 10 + self.rank)
        x = torch.randn(BATCH, FEATURES, generator=g)
        return x, (x[:, :CLASSES].argmax(dim=1) + self.step) % CLASSES

    def train_step(self) -> float:
        x, y = self.batch()
        loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss.item()

    def save_checkpoint(self) -> None:
        root = self.args.checkpoint_dir
        folder = os.path.join(root, f"epoch_0_step_{self.step}")
        for part in ("model", "optim"):
            os.makedirs(os.path.join(folder, part), exist_ok=True)
        rank_state = {"rng": torch.get_rng_state(), "optim": self.optimizer.state_dict(),
                      "scheduler": self.scheduler.state_dict()}
        write_atomically(self.model.module.state_dict(),
                         os.path.join(folder, "model", f"shard-{self.rank}.pt"))
        write_atomically(rank_state, os.path.join(folder, "optim", f"shard-{self.rank}.pt"))
        fsync_path(os.path.join(folder, "model"))
        fsync_path(os.path.join(folder, "optim"))
        dist.barrier()
        if self.rank == 0:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump({"step": self.step}, f)
                f.flush()
                os.fsync(f.fileno())
            fsync_path(folder)
            fsync_path(root)
            link = os.path.join(root, "LATEST.tmp")
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(os.path.basename(folder), link)
            os.replace(link, os.path.join(root, "LATEST"))
            fsync_path(root)
        dist.barrier()

    def load_checkpoint(self) -> None:
        latest = os.path.join(self.args.checkpoint_dir, "LATEST")
        if not os.path.exists(latest):
            return
        with open(os.path.join(latest, "config.json")) as f:
            self.step = json.load(f)["step"]
        self.model.module.load_state_dict(
            torch.load(os.path.join(latest, "model", f"shard-{self.rank}.pt")))
        rank_state = torch.load(os.path.join(latest, "optim", f"shard-{self.rank}.pt"))
        self.optimizer.load_state_dict(rank_state["optim"])
        self.scheduler.load_state_dict(rank_state["scheduler"])
        torch.set_rng_state(rank_state["rng"])
        print(f"rank {self.rank} resumed from {os.readlink(latest)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--steps", type=int, default=17)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=5.0, help="collective timeout (s)")
    parser.add_argument("--variant", choices=VARIANTS, default="correct")
    args = parser.parse_args()

    torch.set_num_threads(1)
    if args.variant == "no_timeout":
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    recipe = Recipe(args)
    recipe.load_checkpoint()
    while recipe.step < args.steps:
        loss = recipe.train_step()
        if recipe.rank == 0:
            print(f"step {recipe.step} loss {loss:.4f}", flush=True)
        if recipe.step % args.save_every == 0:
            recipe.save_checkpoint()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
