"""A GPT training script of our own in the common nanoGPT pattern.

Launched as ``torchrun --standalone --nproc-per-node 2 targets/gpt_lm.py [flags]``
(DDP over gloo on CPU). The shape most single-file GPT trainers share: a small
GPT (token and position embeddings, pre-norm blocks of causal self-attention
and an MLP, dropout, tied output head), an in-memory token array the batches
are cut from at offsets drawn with ``torch.randint`` from the global RNG
(seeded ``seed + rank``), the next batch prefetched right after the forward,
a warmup-then-cosine learning rate computed from ``iter_num``, gradient
clipping, and, every ``--ckpt-every`` iterations, a short evaluation and, on
the master process, one checkpoint saved in place::

    checkpoint = {'model': ..., 'optimizer': ..., 'model_args': ..., 'iter_num': ...,
                  'best_val_loss': ..., 'config': ...}
    torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))

``init_from`` is ``'resume'`` when ``out/ckpt.pt`` exists, else ``'scratch'``.

What that pattern leaves out, and ``--fix`` adds:

- ``--fix atomic``: write ``ckpt.pt.tmp``, flush and fsync it, ``os.replace`` it
  over ``ckpt.pt`` and fsync the folder, so a crash leaves the old checkpoint or
  the new one, and a power loss keeps the last finished one.
- ``--fix rng``: every rank's torch RNG state goes into the checkpoint and is
  restored. The state saved is the one from *before* the prefetched batch was
  drawn (the batch the next step trains on), and the resume draws that batch
  again: saving ``torch.get_rng_state()`` at save time would skip it.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.1


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_drop = nn.Dropout(config.dropout)
        self.resid_drop = nn.Dropout(config.dropout)
        causal = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
        self.register_buffer("causal", causal.view(1, 1, config.block_size, config.block_size),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd),
                                 nn.Dropout(config.dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.size(1)
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float,
                             betas: tuple[float, float]) -> torch.optim.AdamW:
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="max_iters")
    p.add_argument("--ckpt-every", type=int, default=5, help="eval_interval")
    p.add_argument("--out-dir", default="out")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--eval-iters", type=int, default=2)
    p.add_argument("--fix", action="append", choices=("atomic", "rng"), default=[],
                   help="atomic: temp file, fsync, os.replace, folder fsync; rng: checkpoint"
                        " every rank's RNG state of the batch in flight and restore it")
    return p.parse_args()


def token_array(vocab: int, n: int = 4096, seed: int = 0) -> torch.Tensor:
    """The training text: seeded strided runs of tokens with some noise, in memory."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, vocab, (n // 32,), generator=g)
    strides = torch.randint(1, 4, (n // 32,), generator=g)
    runs = (starts[:, None] + strides[:, None] * torch.arange(32)) % vocab
    data = runs.flatten()
    noisy = torch.rand(n, generator=g) < 0.05
    return torch.where(noisy, torch.randint(0, vocab, (n,), generator=g), data)


def save_atomically(obj: object, path: str) -> None:
    """--fix atomic: the new checkpoint is whole and durable before it replaces the old."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    args = parse_args()
    out_dir, eval_interval, max_iters = args.out_dir, args.ckpt_every, args.steps
    batch_size, eval_iters = args.batch_size, args.eval_iters
    learning_rate, min_lr, warmup_iters, lr_decay_iters = 3e-3, 3e-4, 3, max_iters
    weight_decay, beta1, beta2, grad_clip = 0.1, 0.9, 0.95, 1.0
    atomic, keep_rng = "atomic" in args.fix, "rng" in args.fix

    # Bitwise repeatable CPU runs: the harness compares against a fault-free run.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        dist.init_process_group(backend="gloo")
        ddp_rank, world_size = dist.get_rank(), dist.get_world_size()
        master_process = ddp_rank == 0
        seed_offset = ddp_rank
    else:
        ddp_rank, world_size, master_process, seed_offset = 0, 1, True, 0
    if master_process:
        os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(args.seed + seed_offset)

    data = token_array(GPTConfig.vocab_size)
    n = int(0.9 * len(data))
    train_data, val_data = data[:n], data[n:]
    block_size = GPTConfig.block_size

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        d = train_data if split == "train" else val_data
        ix = torch.randint(len(d) - block_size, (batch_size,))
        x = torch.stack([d[i:i + block_size] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    iter_num, best_val_loss = 0, 1e9
    model_args = asdict(GPTConfig())
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    init_from = "resume" if os.path.exists(ckpt_path) else "scratch"
    checkpoint = None
    if init_from == "resume":
        print(f"Resuming training from {out_dir}")
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model_args.update(checkpoint["model_args"])
    model = GPT(GPTConfig(**model_args))
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        iter_num = checkpoint["iter_num"]
        best_val_loss = checkpoint["best_val_loss"]
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2))
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        if keep_rng:
            torch.set_rng_state(checkpoint["rng"][ddp_rank])
    checkpoint = None  # free up memory
    if ddp:
        model = DDP(model)
    raw_model = model.module if ddp else model

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                x, y = get_batch(split)
                _, loss = model(x, y)
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    def get_lr(it: int) -> float:
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)

    rng_in_flight = torch.get_rng_state()  # the RNG state the prefetched batch was drawn from
    X, Y = get_batch("train")  # fetch the very first batch
    while True:
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        if iter_num % eval_interval == 0 and iter_num > 0:
            losses = estimate_loss()
            if master_process:
                print(f"step {iter_num}: train loss {losses['train']:.4f},"
                      f" val loss {losses['val']:.4f}", flush=True)
            best_val_loss = min(best_val_loss, losses["val"])
            rngs = None
            if keep_rng:  # every rank's, gathered on the master process
                rngs = [None] * world_size if ddp else [rng_in_flight]
                if ddp:
                    dist.all_gather_object(rngs, rng_in_flight)
            if master_process:
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "model_args": model_args,
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                    "config": vars(args),
                }
                if keep_rng:
                    checkpoint["rng"] = rngs
                print(f"saving checkpoint to {out_dir}", flush=True)
                if atomic:
                    save_atomically(checkpoint, ckpt_path)
                else:
                    torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))

        _, loss = model(X, Y)
        rng_in_flight = torch.get_rng_state()
        X, Y = get_batch("train")  # prefetch the next batch while the backward runs
        loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num >= max_iters:
            break

    if master_process:
        print(f"done step {iter_num} loss {loss.item()!r}", flush=True)
    if ddp:
        # torch 2.13 + gloo: a DDP reducer freed after its process group was destroyed can
        # deadlock the exit (README, Known limits). Free the model first.
        del model, raw_model
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
