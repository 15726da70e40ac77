#!/usr/bin/env python3
"""Distributed-checkpoint (torch.distributed.checkpoint) toy job.

usage: torchrun ... dcp_train.py [ckpt_dir] [max_steps]
Checkpoints: <ckpt_dir>/iter_<NNNNNN>/ (DCP format). Resumes from the highest iter_*.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

CKPT_DIR = sys.argv[1] if len(sys.argv) > 1 else "dcp_ckpt"
MAX_STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 250
SAVE_EVERY = 30


def banner(*parts):
    if dist.get_rank() == 0:
        print("|", " | ".join(str(p) for p in parts), flush=True)


dist.init_process_group(backend="gloo")
torch.manual_seed(3)
net = torch.nn.Sequential(torch.nn.Linear(128, 1536), torch.nn.SiLU(), torch.nn.Linear(1536, 1536),
                          torch.nn.SiLU(), torch.nn.Linear(1536, 1))
model = DDP(net)
optim = torch.optim.Adam(model.parameters(), lr=5e-4)

it = 0
done = sorted(d for d in os.listdir(CKPT_DIR) if d.startswith("iter_")) if os.path.isdir(CKPT_DIR) else []
if done:
    path = os.path.join(CKPT_DIR, done[-1])
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd, "it": 0}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    it = state["it"]
    banner("resume", path, f"it={it}")

torch.manual_seed(100 + dist.get_rank() + it)
while it < MAX_STEPS:
    x = torch.randn(32, 128)
    y = x.sum(1, keepdim=True).sin()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optim.zero_grad(); loss.backward(); optim.step()
    it += 1
    banner("it", it, f"{loss.item():.5f}")
    if it % SAVE_EVERY == 0:
        t = time.perf_counter()
        msd, osd = get_state_dict(model, optim)
        dcp.save({"model": msd, "optim": osd, "it": it}, checkpoint_id=os.path.join(CKPT_DIR, f"iter_{it:06d}"))
        banner("ckpt", it, f"{time.perf_counter() - t:.2f}s")
    time.sleep(0.05)
banner("end", it)
dist.destroy_process_group()
