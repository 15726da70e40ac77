"""A plain DDP training script that times its own steps, for the overhead benchmark.

The same file runs under plain torchrun and under the harness, so the step
times it writes (rank 0, seconds between the ends of consecutive optimizer
steps, measured inside the training loop) compare the two directly: start-up,
rendezvous and the reference run drop out. Two sizes:

- `small`: the bundled target's TinyLM (21,760 parameters, a few ms a step),
  where the agent's fixed per-step cost shows most;
- `large`: a 12-layer MLP of width 1024 (12.6 M parameters, ~0.3 s a step on
  one core), where the per-byte cost of fingerprinting shows.

It saves a checkpoint (torch.save, then rename) every `--ckpt-every` steps, so
the agent's checkpoint watch is part of what is measured. Where CUDA is there,
each rank trains on cuda:LOCAL_RANK over NCCL (step times then wait for the
device: `torch.cuda.synchronize()` before each reading).

    torchrun --nproc-per-node 2 bench/train_ddp.py --size small --steps 200 --times times.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "targets"))
from tiny_lm import SEQ, VOCAB, TinyLM  # noqa: E402


def model_and_batch(size: str, generator: torch.Generator) -> tuple[nn.Module, torch.Tensor]:
    if size == "small":
        return TinyLM(), torch.randint(0, VOCAB, (8, SEQ + 1), generator=generator)
    width, depth = 1024, 12
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers), torch.randn(32, width, generator=generator)


def loss_of(model: nn.Module, batch: torch.Tensor, size: str) -> torch.Tensor:
    if size == "small":
        logits = model(batch[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    return model(batch).square().mean()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("small", "large"), default="small")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--times", default="step_times.json", help="where rank 0 writes its step times")
    args = p.parse_args()

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(rank)
    model, batch = model_and_batch(args.size, generator)
    model, batch = model.to(device), batch.to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optim = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    times: list[float] = []
    last = time.perf_counter()
    for step in range(1, args.steps + 1):
        optim.zero_grad()
        loss_of(ddp, batch, args.size).backward()
        optim.step()
        if cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        times.append(now - last)
        last = now
        if step % args.ckpt_every == 0 and rank == 0:
            torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step},
                       "ckpt.tmp")
            os.replace("ckpt.tmp", "ckpt.pt")
    if rank == 0:
        Path(args.times).write_text(json.dumps(times[1:]))  # the first step is warm-up
    dist.barrier()
    # torch 2.13: freeing DDP's reducer at exit can abort or deadlock in gloo (see the
    # README's known limits); the bundled target leaves the same way
    os._exit(0)


if __name__ == "__main__":
    main()
