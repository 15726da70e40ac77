"""A DDP script that checkpoints the way Hugging Face's Trainer lays a checkpoint out.

Each save is a folder ``ckpt/checkpoint-N/`` with ``model.safetensors``
(safetensors, written from Rust), ``optimizer.pt`` (torch.save) and
``trainer_state.json`` (plain JSON: step and RNG state); resume takes the
checkpoint folder with the highest N. It knows nothing about any harness.

By default a save is published atomically: written into ``ckpt/tmp-N/``,
every file and the folder fsynced, then renamed to ``checkpoint-N`` and
``ckpt/`` fsynced. ``--in-place`` writes straight into ``checkpoint-N``
(as the Trainer does): a crash mid-save leaves a folder resume picks up.

Run with ``torchrun --standalone --nproc-per-node 2 safetensors_ddp.py``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS, CKPT_EVERY, CKPT_DIR = 20, 5, "ckpt"


def make_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(folder: str, step: int, model: nn.Module,
                     optim: torch.optim.Optimizer) -> None:
    os.makedirs(folder, exist_ok=True)
    save_file(model.state_dict(), os.path.join(folder, "model.safetensors"))
    torch.save(optim.state_dict(), os.path.join(folder, "optimizer.pt"))
    rng = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    with open(os.path.join(folder, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step, "rng": rng}, f)


def save(step: int, model: nn.Module, optim: torch.optim.Optimizer, in_place: bool) -> None:
    final = os.path.join(CKPT_DIR, f"checkpoint-{step}")
    if in_place:
        write_checkpoint(final, step, model, optim)
        return
    tmp = os.path.join(CKPT_DIR, f"tmp-{step}")
    write_checkpoint(tmp, step, model, optim)
    for name in sorted(os.listdir(tmp)):
        fsync(os.path.join(tmp, name))
    fsync(tmp)
    os.rename(tmp, final)
    fsync(CKPT_DIR)


def resume(model: nn.Module, optim: torch.optim.Optimizer) -> int:
    steps = [int(m.group(1)) for name in os.listdir(CKPT_DIR)
             if (m := re.fullmatch(r"checkpoint-(\d+)", name))]
    if not steps:
        return 0
    folder = os.path.join(CKPT_DIR, f"checkpoint-{max(steps)}")
    model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")))
    optim.load_state_dict(torch.load(os.path.join(folder, "optimizer.pt"), weights_only=False))
    with open(os.path.join(folder, "trainer_state.json")) as f:
        state = json.load(f)
    rng = torch.frombuffer(bytearray(base64.b64decode(state["rng"])), dtype=torch.uint8)
    torch.set_rng_state(rng)
    print(f"rank {dist.get_rank()} resumed from {folder}", flush=True)
    return state["global_step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-place", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    os.makedirs(CKPT_DIR, exist_ok=True)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    model = DistributedDataParallel(net)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = resume(net, optim)
    while step < STEPS:
        step += 1
        x, y = make_batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step % CKPT_EVERY == 0:
            if rank == 0:
                save(step, net, optim, args.in_place)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
