"""Tabular classifier, DDP over gloo, checkpoints as loose files in one folder.

The style of a team that ships weights as safetensors: every checkpoint is a
set of files named after its step, and trainer_state.json names the set to
resume from. Each rank reads its own shard of the data in an order drawn from
its own numpy Generator; rank 0 gathers every rank's position and writes:

    <dir>/model-000008.safetensors   weights (safetensors.torch.save_file)
    <dir>/optim-000008.pt            optimizer and LR scheduler (torch.save)
    <dir>/order-000008.npy           each rank's current permutation (numpy.save)
    <dir>/trainer_state.json         step, files, each rank's cursor and Generator state

Every file goes to a temporary name, is fsynced and renamed; trainer_state.json
is written last, and only then are sets beyond the newest --keep removed.

    torchrun --nproc-per-node 2 flat_files.py --save-dir state --keep 1

Variants with a planted bug (--variant):
  in_place     fixed file names (model.safetensors, ...) written straight in place
  rotate_first old sets are removed to make room before the new set is written
  no_file_fsync temp name and os.replace as above, the folder fsynced, but never a file:
               after a power loss the names are there and the bytes are not
"""

from __future__ import annotations

import argparse
import json
import os
import re

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel

IN_DIM, CLASSES, PER_RANK = 20, 5, 48
STATE = "trainer_state.json"
VARIANTS = ("correct", "in_place", "rotate_first", "no_file_fsync")
SET_FILE = re.compile(r"^(model|optim|order)-(\d{6})\.(safetensors|pt|npy)$")


class ShardReader:
    """Batches from this rank's rows, reshuffled each time the shard runs out."""

    def __init__(self, seed: int, rank: int, batch: int) -> None:
        rows = np.random.default_rng([seed, 7, rank])
        teacher = np.random.default_rng([seed, 1]).normal(size=(IN_DIM, CLASSES))
        self.x = rows.normal(size=(PER_RANK, IN_DIM)).astype(np.float32)
        self.y = np.argmax(self.x @ teacher, axis=1)
        self.rng = np.random.Generator(np.random.PCG64([seed, rank]))
        self.batch = batch
        self.order = self.rng.permutation(PER_RANK)
        self.cursor = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor + self.batch > PER_RANK:
            self.order = self.rng.permutation(PER_RANK)
            self.cursor = 0
        take = self.order[self.cursor:self.cursor + self.batch]
        self.cursor += self.batch
        return torch.from_numpy(self.x[take]), torch.from_numpy(self.y[take])

    def position(self) -> dict:
        return {"cursor": self.cursor, "rng": self.rng.bit_generator.state}

    def restore(self, position: dict, order: np.ndarray) -> None:
        self.cursor = position["cursor"]
        self.rng.bit_generator.state = position["rng"]
        self.order = order


def _sync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(obj: dict, path: str, sync: bool = True) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        if sync:
            os.fsync(f.fileno())


class Checkpointer:
    def __init__(self, folder: str, keep: int, variant: str) -> None:
        self.folder, self.keep, self.variant = folder, keep, variant

    def _name(self, kind: str, step: int) -> str:
        ext = {"model": "safetensors", "optim": "pt", "order": "npy"}[kind]
        if self.variant == "in_place":
            return f"{kind}.{ext}"
        return f"{kind}-{step:06d}.{ext}"

    def _sets(self) -> list[int]:
        steps = {int(m.group(2)) for n in os.listdir(self.folder) if (m := SET_FILE.match(n))}
        return sorted(steps)

    def _remove_sets(self, steps: list[int]) -> None:
        for name in os.listdir(self.folder):
            m = SET_FILE.match(name)
            if m and int(m.group(2)) in steps:
                os.remove(os.path.join(self.folder, name))
        _sync(self.folder)

    def save(self, step: int, model: nn.Module, optimizer_state: dict,
             orders: list[np.ndarray], positions: list[dict]) -> None:
        if self.variant == "rotate_first":
            older = self._sets()
            self._remove_sets(older[:max(len(older) - (self.keep - 1), 0)])
        files = {kind: self._name(kind, step) for kind in ("model", "optim", "order")}
        weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        writers = {
            "model": lambda p: save_file(weights, p, metadata={"step": str(step)}),
            "optim": lambda p: torch.save(optimizer_state, p),
            "order": lambda p: np.save(p, np.stack(orders)),
        }
        for kind, name in files.items():
            path = os.path.join(self.folder, name)
            if self.variant == "in_place":
                writers[kind](path)
                _sync(path)
            else:
                # np.save appends .npy to a name without it: give the temp name one too
                tmp = path + (".tmp.npy" if kind == "order" else ".tmp")
                writers[kind](tmp)
                if self.variant != "no_file_fsync":
                    _sync(tmp)
                os.replace(tmp, path)
        _sync(self.folder)
        state = {"step": step, "files": files, "positions": positions}
        state_path = os.path.join(self.folder, STATE)
        if self.variant == "in_place":
            _write_json(state, state_path)
        else:
            _write_json(state, state_path + ".tmp", sync=self.variant != "no_file_fsync")
            os.replace(state_path + ".tmp", state_path)
        _sync(self.folder)
        if self.variant in ("correct", "no_file_fsync"):
            done = self._sets()
            self._remove_sets([s for s in done if s != step][:max(len(done) - self.keep, 0)])

    def load(self) -> dict | None:
        path = os.path.join(self.folder, STATE)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            state = json.load(f)
        files = {k: os.path.join(self.folder, v) for k, v in state["files"].items()}
        state["model"] = load_file(files["model"])
        state["optim"] = torch.load(files["optim"])
        state["order"] = np.load(files["order"])
        return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-dir", default="state")
    parser.add_argument("--total-steps", type=int, default=12)
    parser.add_argument("--checkpoint-interval", type=int, default=4)
    parser.add_argument("--keep", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--variant", choices=VARIANTS, default="correct")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Linear(IN_DIM, 64), nn.LayerNorm(64), nn.GELU(),
                        nn.Linear(64, 64), nn.GELU(), nn.Linear(64, CLASSES))
    model = DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98),
                            weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3,
                                                total_steps=args.total_steps + 1)
    reader = ShardReader(args.seed, rank, args.batch)
    ckpt = Checkpointer(args.save_dir, args.keep, args.variant)
    if rank == 0 and not os.path.isdir(args.save_dir):
        os.makedirs(args.save_dir)
        _sync(os.path.dirname(os.path.abspath(args.save_dir)))
    dist.barrier()

    step = 0
    state = ckpt.load()
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"]["optimizer"])
        sched.load_state_dict(state["optim"]["scheduler"])
        reader.restore(state["positions"][rank], state["order"][rank])
        step = state["step"]
        if rank == 0:
            print(f"restored step {step} from {state['files']['model']}", flush=True)

    while step < args.total_steps:
        x, y = reader.next()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if rank == 0:
            print(f"{step=} loss={loss.item():.4f} lr={sched.get_last_lr()[0]:.6f}", flush=True)
        if step % args.checkpoint_interval == 0:
            everyone = [None] * world
            dist.all_gather_object(everyone, (reader.order, reader.position()))
            if rank == 0:
                ckpt.save(step, net, {"optimizer": opt.state_dict(),
                                      "scheduler": sched.state_dict()},
                          [o for o, _ in everyone], [p for _, p in everyone])
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
