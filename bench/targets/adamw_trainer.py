"""A plain 2-rank DDP trainer (gloo, CPU): an MLP on a synthetic dataset, AdamW.

Written the way the PyTorch DDP tutorial does it, with per-rank checkpoints and
resume from the latest one:

    torchrun --standalone --nproc-per-node 2 adamw_trainer.py --steps 20 --save-every 5

Checkpoints: {ckpt_dir}/step_{step}/rank_{rank}.pt (model, optimizer, step, RNG
states), then {ckpt_dir}/latest naming the step. The last 2 step folders are kept.
`--size-mb MB` makes each rank's checkpoint file about MB megabytes.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

IN_DIM = 64
NUM_CLASSES = 10
NUM_SAMPLES = 2048


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.add_argument("--size-mb", type=float, default=1.0,
                   help="approximate size of each rank's checkpoint file in MB")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def hidden_width(size_mb):
    # checkpoint = params + AdamW exp_avg + exp_avg_sq, all fp32 -> 12 bytes per param
    n_params = size_mb * 1024 * 1024 / 12
    # params of the MLP below: H*H + H*(IN_DIM + NUM_CLASSES + 2) + NUM_CLASSES
    b = IN_DIM + NUM_CLASSES + 2
    h = (-b + math.sqrt(b * b + 4 * (n_params - NUM_CLASSES))) / 2
    return max(8, int(h))


class MLP(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(IN_DIM, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, NUM_CLASSES)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        x = self.dropout(F.gelu(self.fc1(x)))
        x = self.dropout(F.gelu(self.fc2(x)))
        return self.head(x)


def make_dataset(seed):
    # fixed synthetic classification problem, the same on every rank
    rs = np.random.RandomState(seed)
    x = rs.randn(NUM_SAMPLES, IN_DIM).astype(np.float32)
    w = rs.randn(IN_DIM, NUM_CLASSES).astype(np.float32)
    y = (x @ w).argmax(axis=1)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y).long())


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def save_checkpoint(ckpt_dir, step, model, optimizer, rank):
    step_dir = os.path.join(ckpt_dir, f"step_{step}")
    os.makedirs(step_dir, exist_ok=True)
    state = {
        "step": step,
        "model": model.module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
        },
    }
    path = os.path.join(step_dir, f"rank_{rank}.pt")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

    # wait until every rank has its file in place before pointing `latest` at it
    dist.barrier()
    if rank == 0:
        latest = os.path.join(ckpt_dir, "latest")
        with open(latest + ".tmp", "w") as f:
            f.write(f"{step}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(latest + ".tmp", latest)
        cleanup_old(ckpt_dir, keep=2)


def cleanup_old(ckpt_dir, keep):
    steps = []
    for name in os.listdir(ckpt_dir):
        if name.startswith("step_") and name[5:].isdigit():
            steps.append(int(name[5:]))
    for s in sorted(steps)[:-keep]:
        shutil.rmtree(os.path.join(ckpt_dir, f"step_{s}"), ignore_errors=True)


def load_checkpoint(ckpt_dir, model, optimizer, rank):
    latest = os.path.join(ckpt_dir, "latest")
    if not os.path.exists(latest):
        return 0
    with open(latest) as f:
        step = int(f.read().strip())
    path = os.path.join(ckpt_dir, f"step_{step}", f"rank_{rank}.pt")
    # weights_only=False: the checkpoint holds python/numpy RNG states too
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    model.module.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    random.setstate(ckpt["rng"]["python"])
    np.random.set_state(ckpt["rng"]["numpy"])
    return ckpt["step"]


def main():
    args = parse_args()

    def on_sigterm(signum, frame):
        print(f"got signal {signum}, exiting", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()

    set_seed(args.seed)
    dataset = make_dataset(args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    # own generator, so that creating the iterator does not draw from the global RNG
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    steps_per_epoch = len(loader)

    hidden = hidden_width(args.size_mb)
    model = DDP(MLP(hidden))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # different dropout masks per rank
    torch.manual_seed(args.seed + rank)

    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"hidden={hidden} params={n} (~{n * 12 / 2**20:.1f} MB checkpoint per rank)",
              flush=True)

    os.makedirs(args.ckpt_dir, exist_ok=True)
    start_step = load_checkpoint(args.ckpt_dir, model, optimizer, rank)
    if start_step and rank == 0:
        print(f"resumed from step {start_step}", flush=True)

    step = start_step
    epoch = step // steps_per_epoch
    skip = step % steps_per_epoch
    model.train()
    loss = None
    while step < args.steps:
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.save_every == 0:
                save_checkpoint(args.ckpt_dir, step, model, optimizer, rank)
                if rank == 0:
                    print(f"step {step} loss {loss.item():.4f} saved", flush=True)
            if step >= args.steps:
                break
        skip = 0
        epoch += 1

    if rank == 0:
        total = sum(p.double().sum().item() for p in model.parameters())
        print(f"done at step {step}, param sum {total:.10e}", flush=True)
    # drop DDP (its reducer holds the gloo group) before the group goes: else the group can be
    # freed from the reducer's destructor with the GIL held while a gloo worker thread waits
    # for the GIL, and the process hangs at exit (seen once in ~20 runs on torch 2.13 CPU)
    del model, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
