"""Small MLP, DDP over gloo, checkpoints written by a background thread of each rank.

The layout of RL and Megatron-style trainers: every save makes
`<save-dir>/global_step_N/` and each rank writes its own
`model_world_size_W_rank_R.pt` there (model, optimizer, LR schedule, RNG), off the
training thread: one long-lived writer thread per rank takes the state from a queue,
writes it to a temporary name, fsyncs it and renames it into place. At the next save
(and at the end) the training thread waits until its writer has finished the last
one, the ranks meet at a barrier, and rank 0 publishes that step in the tracker file
`<save-dir>/latest_checkpointed_iteration.txt` (temporary file, fsync, rename, fsync
of the folder). A resume reads the tracker; no tracker means a fresh start. The
loader prefetches one batch ahead, as a data loader's workers do; its state is the
position of the next batch training will take (not the one it prefetched).
Collectives time out after --timeout seconds, so a rank that stops (a frozen
node) fails its peers' next collective and torchrun restarts the job.

    torchrun --nproc-per-node 2 async_tracker.py --save-dir ckpts

Variants with a planted bug (--variant):
  no_tracker     the async path forgets the tracker: the checkpoints are written and
                 never published, so every restart trains from step 0
  tracker_first  rank 0 writes the tracker when it hands the state to its writer,
                 before any rank's file of that step exists
  no_timeout     torch's default collective timeout (30 minutes on gloo): a rank
                 stopped inside its save holds every peer at the next barrier
  loader_ahead   the loader's state is saved as its prefetch position: a resume
                 starts one batch ahead (torchtitan#4686)
  rng_one_draw   a resume restores the RNG, then builds a probe head whose init
                 draws from it: dropout is off by those draws (Megatron-Bridge#5257)
  weights_only   the "universal" resume: the weights are loaded, the optimizer and
                 its LR schedule start afresh (DeepSpeed#6691)
"""

from __future__ import annotations

import argparse
import os
import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

VARIANTS = ("correct", "no_tracker", "tracker_first", "no_timeout", "loader_ahead",
            "rng_one_draw", "weights_only")
FEATURES, CLASSES, BATCH = 12, 4, 8
TRACKER = "latest_checkpointed_iteration.txt"


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shard_name(rank: int, world: int) -> str:
    return f"model_world_size_{world}_rank_{rank}.pt"


class BackgroundWriter:
    """One thread that writes each state it is given, in order."""

    def __init__(self, save_dir: str, rank: int, world: int) -> None:
        self.save_dir, self.rank, self.world = save_dir, rank, world
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def submit(self, step: int, state: dict) -> None:
        self.jobs.put((step, state))

    def wait(self) -> None:
        self.jobs.join()

    def _loop(self) -> None:
        while True:
            step, state = self.jobs.get()
            try:
                self._write(step, state)
            finally:
                self.jobs.task_done()

    def _write(self, step: int, state: dict) -> None:
        folder = os.path.join(self.save_dir, f"global_step_{step}")
        os.makedirs(folder, exist_ok=True)
        final = os.path.join(folder, shard_name(self.rank, self.world))
        with open(final + ".tmp", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(final + ".tmp", final)
        fsync_path(folder)
        if self.rank == 0:
            fsync_path(self.save_dir)  # global_step_N/'s own entry


def write_tracker(save_dir: str, step: int) -> None:
    tmp = os.path.join(save_dir, TRACKER + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(save_dir, TRACKER))
    fsync_path(save_dir)


def read_tracker(save_dir: str) -> int:
    try:
        with open(os.path.join(save_dir, TRACKER)) as f:
            return int(f.read().strip())
    except FileNotFoundError:
        return 0


def cpu_copy(state: dict) -> dict:
    """What the writer thread may serialise while training goes on."""
    if isinstance(state, dict):
        return {k: cpu_copy(v) for k, v in state.items()}
    if isinstance(state, list):
        return [cpu_copy(v) for v in state]
    return state.detach().clone() if isinstance(state, torch.Tensor) else state


def batch(seed: int, position: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1000 + position * 10 + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, (x[:, :CLASSES].argmax(dim=1) + position) % CLASSES


class PrefetchingLoader:
    """Hands out batch 0, 1, 2, ... of this rank, always holding the next one ready."""

    def __init__(self, seed: int, rank: int, variant: str) -> None:
        self.seed, self.rank, self.variant = seed, rank, variant
        self.position = 0  # the next batch to build
        self.ready: tuple[torch.Tensor, torch.Tensor] | None = None

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ready is None:
            self._prefetch()
        taken = self.ready
        self._prefetch()
        return taken

    def _prefetch(self) -> None:
        self.ready = batch(self.seed, self.position, self.rank)
        self.position += 1

    def state_dict(self) -> dict:
        if self.variant == "loader_ahead":  # the prefetch position, one past
            return {"position": self.position}
        return {"position": self.position - (self.ready is not None)}

    def load_state_dict(self, state: dict) -> None:
        self.position, self.ready = state["position"], None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-dir", default="ckpts")
    parser.add_argument("--steps", type=int, default=17)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=5.0, help="collective timeout (s)")
    parser.add_argument("--variant", choices=VARIANTS, default="correct")
    args = parser.parse_args()

    torch.set_num_threads(1)
    if args.variant == "no_timeout":
        dist.init_process_group(backend="gloo")
    else:
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(FEATURES, 24), nn.ReLU(), nn.Dropout(0.1), nn.Linear(24, CLASSES)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    os.makedirs(args.save_dir, exist_ok=True)

    loader = PrefetchingLoader(args.seed, rank, args.variant)
    step = read_tracker(args.save_dir)
    if step:
        path = os.path.join(args.save_dir, f"global_step_{step}", shard_name(rank, world))
        state = torch.load(path, weights_only=False)
        model.module.load_state_dict(state["model"])
        if args.variant != "weights_only":
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["lr_scheduler"])
        loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"])
        if args.variant == "rng_one_draw":
            nn.Linear(4, 4)  # a probe head built after the restore: its init draws
        print(f"rank {rank} resumed from global_step_{step}", flush=True)
    writer = BackgroundWriter(args.save_dir, rank, world)
    pending = 0  # the step the writer was last given, not yet published

    def publish() -> None:
        writer.wait()
        dist.barrier()
        if rank == 0 and pending and args.variant not in ("no_tracker", "tracker_first"):
            write_tracker(args.save_dir, pending)

    while step < args.steps:
        x, y = next(loader)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.save_every == 0:
            publish()
            state = cpu_copy({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                              "lr_scheduler": sched.state_dict(), "step": step,
                              "loader": loader.state_dict()})
            state["rng"] = torch.get_rng_state()
            writer.submit(step, state)
            if rank == 0 and args.variant == "tracker_first":
                write_tracker(args.save_dir, step)
            pending = step
    publish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
