"""A DDP training script written the way a lab writes one for Slurm, for real artefacts.

srun starts the ranks itself, one task each (RANK from SLURM_PROCID, the rendezvous at
MASTER_ADDR:MASTER_PORT, which the batch script sets to its first node), as Lightning's
Slurm integration does; under torchrun it takes torchrun's RANK. A log line per step
through `logging` with the time, a checkpoint every few steps (torch.save to a
temporary file, fsync, rename, fsync of the folder), and the lab's time-limit habit:
the job is submitted with `--signal=USR1@SECONDS`, which Slurm
sends every task that long before the limit; the handler asks for a stop, the ranks
agree on the step, rank 0 saves and asks Slurm to requeue the job (`scontrol requeue
$SLURM_JOB_ID`). A requeued job resumes from the newest checkpoint. Nothing here
knows torchchaos.

Variants, each a bug a lab has shipped: `--on-usr1 ignore` (the signal is not handled:
the time limit ends the job and the steps since the last checkpoint are lost),
`--no-fsync` (the save on the signal is renamed into place before its bytes are on
disk), `--no-resume` (a requeued job starts again from step 0).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger("train")
asked_to_stop = False


def _on_usr1(signum: int, frame: object) -> None:
    global asked_to_stop
    asked_to_stop = True


def save(model: nn.Module, opt: torch.optim.Optimizer, step: int, folder: Path,
         fsync: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    final, tmp = folder / f"step-{step:06d}.pt", folder / f".step-{step:06d}.pt.tmp"
    with open(tmp, "wb") as out:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "rng": torch.get_rng_state()}, out)
        if fsync:
            out.flush()
            os.fsync(out.fileno())
    os.replace(tmp, final)
    if fsync:  # the rename is durable once its folder is
        folder_fd = os.open(folder, os.O_DIRECTORY)
        try:
            os.fsync(folder_fd)
        finally:
            os.close(folder_fd)
    log.info("saved checkpoint %s", final)


def newest(folder: Path) -> Path | None:
    found = sorted(folder.glob("step-*.pt"))
    return found[-1] if found else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--timeout", type=float, default=1800.0, help="collective timeout (s)")
    p.add_argument("--on-usr1", choices=("save-requeue", "ignore"), default="save-requeue")
    p.add_argument("--no-fsync", action="store_true")
    p.add_argument("--no-resume", action="store_true")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s [rank %(rank)s] %(levelname)s %(message)s")
    rank = int(os.environ.setdefault("RANK", os.environ.get("SLURM_PROCID", "0")))
    os.environ.setdefault("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))
    logging.getLogger().handlers[0].addFilter(lambda r: setattr(r, "rank", rank) or True)
    if a.on_usr1 == "save-requeue":
        signal.signal(signal.SIGUSR1, _on_usr1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=a.timeout))
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(),
                                                              nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    found = None if a.no_resume else newest(a.ckpt_dir)
    if found is not None:
        state = torch.load(found, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["rng"])
        start = state["step"]
        log.info("resumed from %s at step %d (SLURM_RESTART_COUNT=%s)", found, start, restart)
    else:
        log.info("starting from step 0 (SLURM_RESTART_COUNT=%s)", restart)
    for step in range(start + 1, a.steps + 1):
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(a.step_sleep)
        log.info("step %d loss %.5f", step, loss.item())
        stop = torch.tensor([1 if asked_to_stop else 0])
        dist.all_reduce(stop)  # every rank stops at the same step
        if rank == 0 and (step % a.ckpt_every == 0 or stop.item()):
            # the bug of --no-fsync: the save on the signal, in a hurry, skips the fsyncs
            save(model.module, opt, step, a.ckpt_dir, fsync=not (a.no_fsync and stop.item()))
        if stop.item():
            dist.barrier()
            if rank == 0:
                log.info("USR1: saved at step %d, requeueing job %s", step,
                         os.environ.get("SLURM_JOB_ID"))
                subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
            dist.destroy_process_group()
            return
    log.info("done at step %d", a.steps)
    dist.barrier()  # rank 0 hosts the store: it leaves last, not while others tear down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
