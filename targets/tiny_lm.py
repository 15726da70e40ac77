"""The learning problem both reference targets train: a tiny causal LM on seeded data.

Shared by `ddp_lm.py` and `dcp_lm.py` (imported as a sibling module: torchrun
runs a target as a script, with its folder on `sys.path`). Everything here
is deterministic given the seed, so a resume is exact only if the target
restores all of it: parameters, optimizer, scheduler, data position and every
RNG (torch, CUDA, numpy and python's, all used on purpose).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

VOCAB, SEQ, BATCH, D_MODEL, HEADS, FF, LAYERS = 64, 16, 8, 32, 2, 64, 2
WARMUP = 5


class TinyLM(nn.Module):
    """Decoder-only transformer: encoder layers under a causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.1, batch_first=True)
            for _ in range(LAYERS)
        )
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(n, device=x.device))
        # Built per call rather than as a buffer so DDP has no buffers to broadcast.
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(h)


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=5.0, metavar="SEC",
                   help="collective timeout: a peer that stops answering fails the step after"
                        " SEC seconds (the gloo timeout; NCCL's watchdog on GPUs; default 5)")
    p.add_argument("--watchdog", type=float, default=8.0, metavar="SEC",
                   help="a step (its save included) still running after SEC seconds dumps"
                        " every thread's stack and exits 1, so torchrun restarts (0: off;"
                        " default 8)")
    p.add_argument("--default-timeouts", action="store_true",
                   help="keep torch's default collective timeouts (30 min gloo, 10 min NCCL)"
                        " and no watchdog: a hang then lasts until someone notices")
    p.add_argument("--grace", type=int, default=20, help="seconds allowed after SIGTERM")
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None,
                   help="the process group's backend (default: nccl with CUDA, else gloo);"
                        " gloo lets ranks share one GPU, which NCCL refuses")
    p.add_argument("--step-sleep", type=float, default=0.0)


def seed_globals(seed: int, rank: int, from_clock: bool = False) -> None:
    base = time.time_ns() % 2**31 if from_clock else seed
    torch.manual_seed(base + rank)
    np.random.seed(base + rank)
    random.seed(base + rank)


def make_batch(
    seed: int, pos: int, rank: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch at data position `pos`: a seeded generator makes it replayable."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + pos * 1009 + rank)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    stride = torch.randint(1, 4, (BATCH, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    # The global numpy and python RNGs are used on purpose, so that resume is
    # only exact if their states are checkpointed too.
    noisy = torch.from_numpy(np.random.random((BATCH, SEQ)) < 0.1)
    noise = torch.from_numpy(np.random.randint(0, VOCAB, (BATCH, SEQ))).long()
    seq = torch.roll(seq, shifts=random.randint(0, 3), dims=1)
    inputs = torch.where(noisy, noise, seq[:, :-1])
    return inputs.to(device), seq[:, 1:].to(device)


def token_dataset(seed: int, n: int) -> TensorDataset:
    """`n` fixed (inputs, targets) sequences for targets that read data through a
    DataLoader (the framework targets): strided token runs with 10% noise."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    noisy = torch.rand(n, SEQ, generator=g) < 0.1
    inputs = torch.where(noisy, torch.randint(0, VOCAB, (n, SEQ), generator=g), seq[:, :-1])
    return TensorDataset(inputs, seq[:, 1:])


def loss_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    logits = model(inputs)
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def lr_lambda(total: int) -> Callable[[int], float]:
    def factor(i: int) -> float:
        if i < WARMUP:
            return (i + 1) / WARMUP
        return max(0.0, (total - i) / max(1, total - WARMUP))

    return factor


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
