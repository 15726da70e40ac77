"""Tiny language-model trainer that checkpoints with torch.distributed.checkpoint (DCP).

A small causal transformer is sharded with FSDP2 (``fully_shard``) over a CPU
device mesh, or wrapped in DDP with ``--parallel ddp``, and trained with AdamW on
synthetic token streams that are a pure function of (step, rank), so a resumed
run sees exactly the batches an uninterrupted one would. Every ``--ckpt-every``
steps each rank writes its part of the model, optimizer, LR scheduler and step
counter into ``outputs/checkpoint/step-<N>/`` with ``dcp.save``; only the newest
``--keep`` folders are kept. On start the newest complete folder (one holding a
``.metadata`` file) is loaded with ``dcp.load`` and training continues.

Written apart, as the second held-out target of the incident import (issue 38): by a
helper that did not read the import's readers, in the manner of a trainer built on DCP
(a `[trainer]` logger on rank 0 only, "Finished loading the checkpoint ...; resuming
after step 10", "Finished saving the checkpoint in 0.05 seconds"). Scored blind before
any fix (bench/README.md, 2026-11-28, fifth session).

Launch: ``torchrun --nproc-per-node 2 dcp_trainer.py --steps 20 --ckpt-every 5``
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import shutil
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

logger = logging.getLogger("trainer")
STEP_DIR = re.compile(r"^step-(\d+)$")


def setup_logging(rank: int) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[trainer] %(asctime)s - %(levelname)s - %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 128, heads: int = 4, seq: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.block = Block(dim, heads)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        return self.head(self.norm(self.block(x)))


def make_batch(step: int, rank: int, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """Arithmetic token sequences (start + k * stride mod vocab), seeded by (step, rank)."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 8, (batch, 1), generator=g)
    return (start + stride * torch.arange(seq + 1)) % vocab


class TrainState(Stateful):
    """Everything a resume needs, exposed to DCP as one stateful object."""

    def __init__(self, model: nn.Module, optim: torch.optim.Optimizer, sched) -> None:
        self.model, self.optim, self.sched, self.step = model, optim, sched, 0

    def state_dict(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {"model": model_sd, "optim": optim_sd, "lr_scheduler": self.sched.state_dict(),
                "step": torch.tensor(self.step, dtype=torch.int64)}

    def load_state_dict(self, sd: dict) -> None:
        set_state_dict(self.model, self.optim,
                       model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.sched.load_state_dict(sd["lr_scheduler"])
        self.step = int(sd["step"])


def latest_checkpoint(root: str) -> int | None:
    if not os.path.isdir(root):
        return None
    steps = [int(m.group(1)) for name in os.listdir(root) if (m := STEP_DIR.match(name))
             and os.path.isfile(os.path.join(root, name, ".metadata"))]
    return max(steps, default=None)


def prune_checkpoints(root: str, keep: int) -> None:
    steps = sorted(int(m.group(1)) for n in os.listdir(root) if (m := STEP_DIR.match(n)))
    for step in steps[:-keep]:
        logger.info("Removing old checkpoint %s", os.path.join(root, f"step-{step}"))
        shutil.rmtree(os.path.join(root, f"step-{step}"), ignore_errors=True)


def save_checkpoint(state: TrainState, root: str, keep: int, rank: int) -> None:
    path = os.path.join(root, f"step-{state.step}")
    logger.info("Saving the checkpoint at step %d to %s.", state.step, path)
    t0 = time.perf_counter()
    dcp.save({"train": state}, checkpoint_id=path)
    logger.info("Finished saving the checkpoint in %.2f seconds.", time.perf_counter() - t0)
    dist.barrier()
    if rank == 0:
        prune_checkpoints(root, keep)


def wrap_model(model: nn.Module, parallel: str, world: int) -> nn.Module:
    if parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        fully_shard(model.block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return nn.parallel.DistributedDataParallel(model)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--ckpt-dir", default="outputs/checkpoint")
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    args, unknown = p.parse_known_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    setup_logging(rank)
    if unknown:
        logger.warning("Ignoring unrecognised arguments: %s", " ".join(unknown))
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    vocab = 256
    model = TinyLM(vocab=vocab, seq=args.seq)
    n_params = sum(t.numel() for t in model.parameters())
    model = wrap_model(model, args.parallel, world)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, (s + 1) / args.warmup))
    state = TrainState(model, optim, sched)
    logger.info("Model TinyLM: %d parameters (%.2f MB), %s over %d ranks, gloo backend.",
                n_params, n_params * 4 / 2**20, args.parallel.upper(), world)

    found = latest_checkpoint(args.ckpt_dir) if rank == 0 else None
    box = [found]
    dist.broadcast_object_list(box, src=0)
    if box[0] is None:
        logger.info("No checkpoint found in %s; training starts from scratch.", args.ckpt_dir)
    else:
        path = os.path.join(args.ckpt_dir, f"step-{box[0]}")
        logger.info("Loading the checkpoint at step %d.", box[0])
        t0 = time.perf_counter()
        dcp.load({"train": state}, checkpoint_id=path)
        logger.info("Finished loading the checkpoint in %.2f seconds; resuming after step %d.",
                    time.perf_counter() - t0, state.step)

    model.train()
    loss = torch.tensor(math.nan)
    logger.info("Training steps %d..%d.", state.step + 1, args.steps)
    while state.step < args.steps:
        state.step += 1
        t0 = time.perf_counter()
        data = make_batch(state.step, rank, args.batch, args.seq, vocab)
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        optim.step()
        sched.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        global_loss /= world
        tps = args.batch * args.seq * world / (time.perf_counter() - t0)
        logger.info("step: %2d  loss: %7.4f  grad_norm: %6.3f  lr: %.2e  tps: %6.0f",
                    state.step, global_loss.item(), grad_norm.item(),
                    sched.get_last_lr()[0], tps)
        loss = global_loss
        if state.step % args.ckpt_every == 0:
            save_checkpoint(state, args.ckpt_dir, args.keep, rank)

    logger.info("Training completed at step %d, final loss %.6f.", state.step, loss.item())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
