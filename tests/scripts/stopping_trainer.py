"""A DDP trainer as a new user writes one, with the bug of a rank that stops.

    torchrun --nproc_per_node 2 stopping_trainer.py OUT [--steps 400] [--save-every 50]
        [--step-sleep 0.2] [--timestamps] [--stop-rank 1 --stop-at 15]

Prints a line per step (with `--timestamps`, through `logging` with the time in front,
as `%(asctime)s`), saves OUT/ckpt.pt from rank 0 every `--save-every` steps and resumes
from it. The collective timeout is an hour, longer than the job's time limit, as on
many clusters: a rank that stops leaves its peers waiting until the scheduler ends the
job. `--stop-rank R --stop-at N` is the bug: after its step N, rank R stops itself
(SIGSTOP), outside any collective.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--timestamps", action="store_true")
    p.add_argument("--stop-rank", type=int, default=None)
    p.add_argument("--stop-at", type=int, default=None)
    return p.parse_args()


def main() -> None:
    args = parse()
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
    rank = dist.get_rank()
    if args.timestamps:
        logging.basicConfig(level=logging.INFO,
                            format=f"%(asctime)s [rank {rank}] %(levelname)s %(message)s")
        say = logging.getLogger("train").info
    else:
        def say(message: str) -> None:
            print(message, flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = os.path.join(args.out, "ckpt.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        say(f"resumed from {path} at step {step}")
    while step < args.steps:
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(step * 7 + rank))
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        say(f"step {step} loss {loss.item():.5f}")
        if rank == args.stop_rank and step == args.stop_at:
            os.kill(os.getpid(), signal.SIGSTOP)
        if step % args.save_every == 0 and rank == 0:
            os.makedirs(args.out, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       path + ".tmp")
            os.replace(path + ".tmp", path)
            say(f"saved {path} at step {step}")
        time.sleep(args.step_sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
