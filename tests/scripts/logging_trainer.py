"""Small DDP trainer: MLP on a synthetic teacher task, AdamW, atomic checkpoints, auto-resume.

Written apart, as a held-out target of the incident import (issue 38): by a helper
that did not read the import's readers, in the style of a team that logs through
Python's `logging` (timestamps, `rank=N`, `global_step=12 loss=...`, "restored state
from ...", "checkpoint ... committed"), with folders `runs/ckpt/global_step_N/` and a
COMPLETE marker. Scored blind before any fix (bench/README.md, 2026-11-28, fifth session).

Launch: torchrun --nproc-per-node 2 logging_trainer.py --steps 20 --ckpt-every 5
"""
import argparse
import logging
import math
import os
import re
import shutil
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CKPT_ROOT = os.path.join("runs", "ckpt")
CKPT_RE = re.compile(r"^global_step_(\d+)$")
KEEP_LAST = 2
D_IN, D_HIDDEN, N_CLASSES, BATCH = 256, 512, 32, 64

log = logging.getLogger("trainer")


class RankFilter(logging.Filter):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def filter(self, record):
        record.rank = self.rank
        return True


def setup_logging(rank):
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s | %(levelname)s | rank=%(rank)s | %(message)s"))
    handler.addFilter(RankFilter(rank))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="total optimizer steps to reach")
    p.add_argument("--ckpt-every", type=int, default=10, help="checkpoint interval in steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=1234)
    args, unknown = p.parse_known_args()
    return args, unknown


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D_IN, D_HIDDEN)
        self.fc2 = nn.Linear(D_HIDDEN, N_CLASSES)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def make_batch(step, rank, world, seed, teacher):
    """Each (step, rank) pair always yields the same batch: a resumed run replays the data."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * world + rank)
    x = torch.randn(BATCH, D_IN, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return x, y


def lr_at(step, args):
    # Function of the step only (not of --steps), so extending a run keeps the same schedule.
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    return args.lr * max(0.1, 0.5 * (1 + math.cos(math.pi * min(step, 1000) / 1000)))


def find_latest_checkpoint():
    if not os.path.isdir(CKPT_ROOT):
        return None
    found = []
    for name in os.listdir(CKPT_ROOT):
        m = CKPT_RE.match(name)
        path = os.path.join(CKPT_ROOT, name)
        if m and os.path.isfile(os.path.join(path, "COMPLETE")):
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None


def save_checkpoint(step, model, optim, loss):
    final = os.path.join(CKPT_ROOT, f"global_step_{step}")
    tmp = os.path.join(CKPT_ROOT, f".tmp_global_step_{step}")
    log.info("writing checkpoint for global_step=%d to %s", step, final)
    t0 = time.time()
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    torch.save(model.state_dict(), os.path.join(tmp, "model.pt"))
    torch.save({"optimizer": optim.state_dict(), "global_step": step, "loss": loss},
               os.path.join(tmp, "optim.pt"))
    if os.path.exists(final):  # stale copy from an earlier attempt
        shutil.rmtree(final)
    os.rename(tmp, final)
    with open(os.path.join(final, "COMPLETE"), "w") as f:
        f.write(f"{step}\n")
        f.flush()
        os.fsync(f.fileno())
    log.info("checkpoint global_step=%d committed in %.3fs", step, time.time() - t0)
    prune_checkpoints()


def prune_checkpoints():
    done = sorted((int(m.group(1)), n) for n in os.listdir(CKPT_ROOT) if (m := CKPT_RE.match(n))
                  and os.path.isfile(os.path.join(CKPT_ROOT, n, "COMPLETE")))
    for _step, name in done[:-KEEP_LAST]:
        shutil.rmtree(os.path.join(CKPT_ROOT, name), ignore_errors=True)
        log.info("pruned old checkpoint %s", name)


def main():
    args, unknown = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    setup_logging(rank)
    if unknown:
        log.warning("ignoring unrecognised arguments: %s", " ".join(unknown))

    def on_sigterm(signum, frame):
        log.warning("received SIGTERM, exiting without further checkpointing")
        logging.shutdown()
        os._exit(143)
    signal.signal(signal.SIGTERM, on_sigterm)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    teacher = torch.randn(D_IN, N_CLASSES, generator=torch.Generator().manual_seed(args.seed + 7))
    model = MLP()
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("world_size=%d params=%d (%.2f MB fp32) cwd=%s", world, n_params,
             n_params * 4 / 2**20, os.getcwd())

    # Rank 0 decides which checkpoint to use so every rank resumes from the same one.
    choice = [find_latest_checkpoint() if rank == 0 else None]
    dist.broadcast_object_list(choice, src=0)
    start_step, final_loss = 0, None
    if choice[0] is not None:
        model.load_state_dict(torch.load(os.path.join(choice[0], "model.pt"), map_location="cpu"))
        ostate = torch.load(os.path.join(choice[0], "optim.pt"), map_location="cpu")
        optim.load_state_dict(ostate["optimizer"])
        start_step = int(ostate["global_step"])
        final_loss = ostate.get("loss")
        log.info("restored state from %s, continuing at global_step=%d", choice[0], start_step)
    else:
        log.info("no usable checkpoint under %s, training from scratch (global_step=0)", CKPT_ROOT)

    ddp = DDP(model)
    for step in range(start_step, args.steps):
        t0 = time.time()
        lr = lr_at(step, args)
        for group in optim.param_groups:
            group["lr"] = lr
        x, y = make_batch(step, rank, world, args.seed, teacher)
        loss = F.cross_entropy(ddp(x), y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        final_loss = reduced.item() / world
        gstep = step + 1
        log.info("global_step=%d loss=%.4f lr=%.1e dt=%.1fms", gstep, final_loss, lr,
                 (time.time() - t0) * 1e3)

        if gstep % args.ckpt_every == 0:
            if rank == 0:
                save_checkpoint(gstep, model, optim, final_loss)
            dist.barrier()

    if rank == 0:
        shown = "n/a" if final_loss is None else f"{final_loss:.6f}"
        log.info("run complete: reached global_step=%d, final loss %s",
                 max(args.steps, start_step), shown)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
