# DDP toy autoencoder; every rank writes its own checkpoint shard
#   ckpt/step_<N>/rank<R>.pt   (model, optimizer, RNG state)
# and resumes from the newest step_* directory that has a shard for every rank.
import glob, os, re, sys, time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass
class Cfg:
    total_steps: int = 300
    save_interval: int = 50
    step_time: float = 0.1
    ckpt_root: str = "ckpt"
    dim: int = 256


def shard_path(cfg, step, rank):
    return os.path.join(cfg.ckpt_root, f"step_{step}", f"rank{rank}.pt")


def find_resume(cfg, world):
    steps = sorted((int(m.group(1)) for d in glob.glob(os.path.join(cfg.ckpt_root, "step_*"))
                    if (m := re.search(r"step_(\d+)$", d))), reverse=True)
    for s in steps:
        if all(os.path.exists(shard_path(cfg, s, r)) for r in range(world)):
            return s
    return None


def main(cfg=Cfg()):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    say = lambda *a: print(f"{time.strftime('%H:%M:%S')} rank={rank}", *a, flush=True)

    ae = nn.Sequential(nn.Linear(cfg.dim, 64), nn.ReLU(), nn.Linear(64, cfg.dim))
    model = nn.parallel.DistributedDataParallel(ae)
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    torch.manual_seed(rank)
    step = 0
    s = find_resume(cfg, world)
    if s is not None:
        st = torch.load(shard_path(cfg, s, rank), weights_only=False)
        ae.load_state_dict(st["model"]); opt.load_state_dict(st["optim"])
        torch.set_rng_state(st["rng"]); step = st["step"]
        say(f"loaded {shard_path(cfg, s, rank)}")
    else:
        say("starting from scratch")

    while step < cfg.total_steps:
        x = torch.rand(64, cfg.dim)
        loss = nn.functional.mse_loss(model(x), x)
        opt.zero_grad(); loss.backward(); opt.step()
        step += 1
        say(f"step {step} mse {loss.item():.6f}")
        if step % cfg.save_interval == 0:
            os.makedirs(os.path.dirname(shard_path(cfg, step, rank)), exist_ok=True)
            torch.save({"model": ae.state_dict(), "optim": opt.state_dict(),
                        "rng": torch.get_rng_state(), "step": step}, shard_path(cfg, step, rank))
            say(f"shard saved: {shard_path(cfg, step, rank)}")
        time.sleep(cfg.step_time)
    say("all steps done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
