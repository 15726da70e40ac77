"""Tiny next-token language model, DDP over gloo, one snapshot per epoch.

The style of a research codebase: a DistributedSampler reshuffles the corpus
every epoch (set_epoch), inputs get random token masking from torch's global
RNG (seeded alike on every rank, so rank 0's state is everyone's), and rank 0
alone writes the whole training state at the end of each epoch into one file,
<out>/snapshot.pt, via a temporary file and os.replace. Resume restarts at the
epoch after the snapshot's.

    torchrun --nproc-per-node 2 epoch_snapshot.py --out checkpoints --epochs 3

Variants with a planted bug (--variant):
  in_place      torch.save straight onto snapshot.pt (nanoGPT's way: no fsync either)
  no_fsync      the temporary file and os.replace, but nothing is ever fsynced
  no_rng        the RNG state is not in the snapshot (masking restarts its stream)
  repeat_epoch  resume runs the snapshot's epoch again
  skip_epoch    resume jumps over the epoch after the snapshot's
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB = 40
CONTEXT = 10
SEQUENCES = 32  # 16 per rank, 4 per batch: 4 steps an epoch
MASK_ID = 0
VARIANTS = ("correct", "in_place", "no_fsync", "no_rng", "repeat_epoch", "skip_epoch")


class BigramLM(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.drop = nn.Dropout(0.1)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.embed(tokens))
        return self.head(torch.tanh(self.proj(h)))


def synthetic_corpus(seed: int) -> TensorDataset:
    """Sequences from a noisy affine Markov chain, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    seqs = torch.empty(SEQUENCES, CONTEXT + 1, dtype=torch.long)
    seqs[:, 0] = torch.randint(1, VOCAB, (SEQUENCES,), generator=g)
    for t in range(1, CONTEXT + 1):
        noise = torch.randint(0, 3, (SEQUENCES,), generator=g)
        seqs[:, t] = (seqs[:, t - 1] * 7 + 3 + noise) % (VOCAB - 1) + 1
    return TensorDataset(seqs[:, :-1], seqs[:, 1:])


def warmup_then_cosine(total: int, warmup: int = 2) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))
    return factor


def write_snapshot(state: dict, path: str, variant: str) -> None:
    if variant == "in_place":
        torch.save(state, path)
        return
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.partial")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        if variant != "no_fsync":
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if variant == "no_fsync":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="checkpoints")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--variant", choices=VARIANTS, default="correct")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)

    data = synthetic_corpus(args.seed)
    sampler = DistributedSampler(data, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DistributedDataParallel(BigramLM())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    total_steps = args.epochs * len(loader)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_then_cosine(total_steps))

    snapshot = os.path.join(args.out, "snapshot.pt")
    start_epoch, step = 0, 0
    if os.path.exists(snapshot):
        state = torch.load(snapshot, map_location="cpu")
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if "rng" in state:
            torch.set_rng_state(state["rng"])
        step = state["step"]
        start_epoch = {"repeat_epoch": state["epoch"],
                       "skip_epoch": state["epoch"] + 2}.get(args.variant, state["epoch"] + 1)
        if rank == 0:
            print(f"resuming at epoch {start_epoch} (snapshot of epoch {state['epoch']})",
                  flush=True)
    elif rank == 0:
        os.makedirs(args.out, exist_ok=True)
        parent = os.path.dirname(os.path.abspath(args.out))
        fd = os.open(parent, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    model.train()
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            masked = inputs.masked_fill(torch.rand(inputs.shape) < 0.15, MASK_ID)
            logits = model(masked)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
        if rank == 0:
            state = {"epoch": epoch, "step": step, "model": model.module.state_dict(),
                     "optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
            if args.variant != "no_rng":
                state["rng"] = torch.get_rng_state()
            write_snapshot(state, snapshot, args.variant)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
