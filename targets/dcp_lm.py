"""Reference target: the tiny LM sharded with FSDP2, checkpointed asynchronously with DCP.

Launched as ``torchrun --standalone --nproc-per-node 2 targets/dcp_lm.py [flags]``
from a fresh run directory (gloo on CPU; NCCL plus gloo on GPUs). It trains the
same problem as ``ddp_lm.py``, bitwise deterministically, with the model and
optimizer state sharded across ranks (``fully_shard``), and checkpoints with
``torch.distributed.checkpoint.async_save``: a sharded, multi-file save written
by a background thread while training goes on.

A checkpoint is a folder ``ckpt/step-000010/``: one ``__R_0.distcp`` file per
rank with that rank's shards and per-rank state, plus DCP's ``.metadata``.
The protocol:

1. after step N, every rank stages its state (model and optimizer shards, the
   scheduler, step and data position, and its own RNG states under a key of
   its own) and starts ``async_save`` on a process group kept for checkpoints,
   so its collectives never interleave with training's;
2. at the end of step N+1 every rank waits for its save. DCP's coordinator
   writes ``.metadata`` only after every rank's files are written and fsynced,
   but renames it into place without fsyncing the folder, so rank 0 fsyncs
   ``step-N/`` and ``ckpt/``, hashes every file and only then publishes the
   checkpoint in ``ckpt/manifest.json`` (temp file, fsync, rename, folder
   fsync); after that it deletes the folders the manifest no longer lists;
3. on start, rank 0 picks the newest manifest entry whose files all match
   their sha256 and every rank loads it with ``dcp.load``.

SIGTERM: wait for the save in flight, save the current step, exit 143.

``main`` is decorated with torchelastic's ``@record``, as torchtitan's entry point
is: a rank that raises also writes its error file (``TORCHELASTIC_ERROR_FILE``),
whose traceback torchrun prints in its failure summary.

``--sync-save``: the same protocol with ``dcp.save`` (the training thread writes,
and the save is committed at once).

``--bug NAME`` plants one recovery bug:

- ``early_pointer``: the manifest entry is published when the save starts,
  before ``async_save`` wrote anything, and resume trusts it unverified.
- ``no_fsync``: DCP writes with ``sync_files=False`` and neither the folders
  nor the manifest are fsynced: a power loss drops finished checkpoints.
- ``no_dir_fsync``: DCP fsyncs its files and the manifest is written durably, but
  neither the step folder's entry nor its ``.metadata`` rename is fsynced: the
  manifest can outlive the folder it names.
- ``rank0_metadata``: the RNG states are saved by rank 0 only, under one key
  every rank loads, so after a resume every rank draws rank 0's random numbers.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import fully_shard

# Sibling modules: a script's own folder comes first on sys.path.
from durable import fsync_dir, publish_in_manifest, read_manifest, sha256_file
from launch import Preemption, collective_timeout, finish, init_distributed, run, step_watchdog
from tiny_lm import (
    TinyLM,
    add_common_args,
    loss_of,
    lr_lambda,
    make_batch,
    rng_state,
    seed_globals,
    set_rng_state,
)

BUGS = ("none", "early_pointer", "no_fsync", "no_dir_fsync", "rank0_metadata")

# The model's output is a view of the head's matmul; nothing edits it in place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--bug", choices=BUGS, default="none")
    p.add_argument("--sync-save", action="store_true",
                   help="dcp.save in the training thread instead of async_save")
    return p.parse_args()


@dataclass
class InFlight:
    """An async save that has not been waited for yet."""

    step: int
    path: str
    future: Future[Any]


@dataclass
class Trainer:
    args: argparse.Namespace
    device: torch.device
    model: torch.nn.Module
    optim: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    ckpt_group: dist.ProcessGroup
    step: int = 0
    data_pos: int = 0
    loss: float = float("nan")
    in_flight: InFlight | None = None

    @property
    def rng_key(self) -> str:
        return "rng" if self.args.bug == "rank0_metadata" else f"rng.rank{dist.get_rank()}"

    def state_dict(self, saving: bool) -> dict[str, Any]:
        """What a checkpoint holds; plain objects go in pickled (DCP stores bytes as is)."""
        model_state, optim_state = get_state_dict(self.model, self.optim)
        progress = {"step": self.step, "data_pos": self.data_pos, "loss": self.loss,
                    "sched": self.sched.state_dict()}
        state = {"model": model_state, "optim": optim_state, "progress": pickle.dumps(progress)}
        if not saving or self.args.bug != "rank0_metadata" or dist.get_rank() == 0:
            state[self.rng_key] = pickle.dumps(rng_state(self.device))
        return state


# -- manifest ----------------------------------------------------------------
def publish(args: argparse.Namespace, step: int, name: str, files: dict[str, str]) -> None:
    """Rank 0: list checkpoint `name` in the manifest, then drop what fell off it."""
    entry = {"step": step, "dir": name, "files": files}
    sync = args.bug != "no_fsync"
    for dropped in publish_in_manifest(args.ckpt_dir, entry, "dir", args.keep, sync):
        shutil.rmtree(os.path.join(args.ckpt_dir, dropped), ignore_errors=True)


def verified(directory: str, entry: dict[str, Any]) -> bool:
    folder = os.path.join(directory, entry["dir"])
    for name, digest in entry["files"].items():
        path = os.path.join(folder, name)
        if not os.path.exists(path) or sha256_file(path) != digest:
            print(f"skipping {folder}: {name} missing or damaged", file=sys.stderr)
            return False
    return True


def choose_checkpoint(args: argparse.Namespace) -> str | None:
    """Rank 0 picks the folder to resume from; None means a fresh start."""
    entries = sorted(read_manifest(args.ckpt_dir), key=lambda e: e["step"], reverse=True)
    for e in entries:
        if args.bug == "early_pointer" or verified(args.ckpt_dir, e):
            return os.path.join(args.ckpt_dir, e["dir"])
    return None


# -- save, commit, resume ----------------------------------------------------
def start_save(t: Trainer) -> None:
    """Stage this step's state and write it in the background (every rank)."""
    name = f"step-{t.step:06d}"
    path = os.path.join(t.args.ckpt_dir, name)
    if t.args.bug == "early_pointer" and dist.get_rank() == 0:
        publish(t.args, t.step, name, {})
    writer = dcp.FileSystemWriter(path, sync_files=t.args.bug != "no_fsync")
    state = t.state_dict(saving=True)
    if t.args.sync_save:
        done: Future[Any] = Future()
        done.set_result(dcp.save(state, storage_writer=writer, process_group=t.ckpt_group))
        t.in_flight = InFlight(t.step, path, done)
        commit(t)
        return
    future = dcp.async_save(state, storage_writer=writer, process_group=t.ckpt_group)
    t.in_flight = InFlight(t.step, path, future)


def commit(t: Trainer) -> None:
    """Wait for the save in flight; rank 0 makes it durable and publishes it."""
    pending, t.in_flight = t.in_flight, None
    if pending is None:
        return
    pending.future.result()  # re-raises a failed write (ENOSPC, EIO): the job restarts
    if dist.get_rank() != 0 or t.args.bug == "early_pointer":
        return
    sync = t.args.bug not in ("no_fsync", "no_dir_fsync")
    fsync_dir(pending.path, sync)  # the .metadata rename
    fsync_dir(t.args.ckpt_dir, sync)  # the step-N folder itself
    names = sorted(os.listdir(pending.path))
    files = {n: sha256_file(os.path.join(pending.path, n)) for n in names}
    publish(t.args, pending.step, os.path.basename(pending.path), files)


def resume(t: Trainer) -> None:
    choice = [choose_checkpoint(t.args) if dist.get_rank() == 0 else None]
    # One decision for all ranks, so they cannot resume from different steps.
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return
    state = t.state_dict(saving=False)
    dcp.load(state, checkpoint_id=choice[0])
    set_state_dict(t.model, t.optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    progress = pickle.loads(state["progress"])
    t.sched.load_state_dict(progress["sched"])
    t.step, t.data_pos, t.loss = progress["step"], progress["data_pos"], progress["loss"]
    set_rng_state(pickle.loads(state[t.rng_key]), t.device)
    if dist.get_rank() == 0:
        print(f"resumed from {choice[0]} at step {t.step}", flush=True)


# -- training ----------------------------------------------------------------
def setup(args: argparse.Namespace) -> Trainer:
    # async_save needs a CPU backend next to NCCL.
    backend = args.backend or ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    device = init_distributed(collective_timeout(args), backend)
    ckpt_group = dist.new_group(backend="gloo")
    os.makedirs(args.ckpt_dir, exist_ok=True)
    seed_globals(args.seed, dist.get_rank())
    model = TinyLM().to(device)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(args.steps))
    return Trainer(args, device, model, optim, sched, ckpt_group)


def train_step(t: Trainer) -> None:
    t.step, t.data_pos = t.step + 1, t.data_pos + 1
    loss = loss_of(t.model, make_batch(t.args.seed, t.data_pos, dist.get_rank(), t.device))
    t.optim.zero_grad(set_to_none=True)
    loss.backward()
    t.optim.step()
    t.sched.step()
    t.loss = loss.item()


@record
def main() -> None:
    args = parse_args()
    t = setup(args)
    preempt = Preemption(args.grace)
    watchdog = step_watchdog(args)
    watchdog.step_begins()  # the resume counts as the first step's
    resume(t)
    while t.step < args.steps:
        train_step(t)
        watchdog.step_begins()
        if dist.get_rank() == 0 and t.step % 10 == 0:
            print(f"step {t.step} loss {t.loss:.4f}", flush=True)
        time.sleep(args.step_sleep)
        if t.in_flight is not None:
            commit(t)  # the save overlapped one training step
        if t.step % args.ckpt_every == 0:
            start_save(t)
        if preempt.agreed(t.device):
            commit(t)
            if t.step % args.ckpt_every != 0:
                start_save(t)
                commit(t)
            # Nonzero so that torchrun restarts the workers, which then resume.
            finish(143, f"preempted at step {t.step}, checkpoint saved", args.grace)
    commit(t)
    finish(0, f"done step {t.step} loss {t.loss!r}", args.grace)


if __name__ == "__main__":
    run(main)
