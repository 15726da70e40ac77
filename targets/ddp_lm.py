"""Reference target: a tiny DDP language model with careful checkpoint/resume.

Launched as ``torchrun --standalone --nproc-per-node 2 targets/ddp_lm.py [flags]``
from a fresh run directory. With identical flags it is bitwise deterministic on
CPU, and a run that is killed and resumed ends in exactly the same state as an
uninterrupted one: checkpoints hold model, optimizer, scheduler, step and the
RNG states (torch, CUDA, numpy, python) of every rank, are written atomically
(temp file + fsync + os.replace + directory fsync) and are listed with their
sha256 in ``manifest.json``. SIGTERM asks for a checkpoint at the end of the
current step and an exit with status 143, so torchrun restarts the workers.

Silent data corruption defences (``targets/sdc_guard.py``), on by default:
a cross-replica weight hash every ``--replica-check-every`` steps and before
every save (so no checkpoint holds unchecked state), a non-finite loss guard
and a loss-spike guard. When one fires, every rank reports the detection to
the harness and rolls back to the newest verified checkpoint (at most
``--max-rollbacks`` times, then it crashes). ``--no-sdc-defences`` turns them
all off: the undefended target the harness must flag.

``--loader-workers N`` hands each step's data position over through a
``torch.utils.data.DataLoader`` with N worker processes (the batch itself is
still made in the rank, from its checkpointed RNG states), so that a dead or
stuck worker meets torch's own error path.

``--state-mb MB`` gives every rank MB megabytes more training state (a stand-in
for the parameter and optimizer shards a large model keeps per rank), saved by
each rank into its own file (``rank<R>-step-<N>.pt``, written atomically) before
rank 0 publishes the step: checkpoints of the sizes real jobs write, for the
harness's benchmarks (``bench/crashstates_scale.py``).

``--bug NAME`` plants exactly one recovery bug, for the harness to find:

- ``write_in_place``: torch.save straight into ``ckpt/latest.pt``, no temp file,
  no manifest; a kill during a save leaves a torn file that breaks resume.
- ``skip_rng``: resume does not restore RNG state.
- ``skip_optim``: resume does not restore the optimizer.
- ``skip_sched``: resume does not restore the LR scheduler.
- ``off_by_one``: resume skips one batch of data (step count stays right).
- ``sparse_ckpt``: checkpoints every 2 * --ckpt-every steps.
- ``early_pointer``: the manifest entry is written before the data file, which
  is written in place, and resume does not verify checksums.
- ``no_fsync``: the correct protocol minus every fsync.
- ``no_verify``: resume trusts the newest checkpoint the manifest names without
  checking its sha256, so bit rot in it is loaded as if it were training state.
- ``replay_data``: resume restores the model but starts the data stream over from
  the first batch (the data position is not restored): batches are seen twice.
- ``resume_twice``: resume skips one batch for each earlier resume the checkpoint
  records (a "skip what the restarts replayed" correction applied twice). A first
  resume is exact: only two failures with a checkpoint committed between them show it.
- ``nondeterministic``: global RNGs are seeded from the clock.
- ``crash``: rank 0 raises RuntimeError at step --steps // 2.
- ``publish_on_error``: the checkpoint is written to ``ckpt/latest.pt.tmp`` and
  renamed to ``ckpt/latest.pt`` in a ``finally:`` block, so an exception in the
  middle of the write publishes the half-written file; resume loads ``latest.pt``.
- ``split_brain``: a rank whose collective fails (its peers are cut off) trains on
  alone as a world of one and, being rank 0 of that world, publishes checkpoints
  under the names the whole job uses: both sides of a partition write them.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# Sibling modules: a script's own folder comes first on sys.path.
from durable import atomic_write, publish_in_manifest, read_manifest, sha256_file, write_file
from launch import Preemption, collective_timeout, finish, init_distributed, run, step_watchdog
from sdc_guard import SdcGuard
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

BUGS = (
    "none",
    "write_in_place",
    "skip_rng",
    "skip_optim",
    "skip_sched",
    "off_by_one",
    "sparse_ckpt",
    "early_pointer",
    "no_fsync",
    "no_verify",
    "replay_data",
    "resume_twice",
    "nondeterministic",
    "crash",
    "publish_on_error",
    "split_brain",
)


try:
    from torchchaos.api import report_detection
except ImportError:  # runs without torchchaos installed too

    def report_detection(what: str, **details: Any) -> None:
        pass


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--bug", choices=BUGS, default="none")
    p.add_argument("--loader-workers", type=int, default=0, metavar="N",
                   help="DataLoader worker processes that hand over each step's data position")
    p.add_argument("--state-mb", type=float, default=0.0, metavar="MB",
                   help="MB of extra training state per rank, each rank saving its own file"
                        " (default 0: rank 0 writes one file)")
    p.add_argument("--replica-check-every", type=int, default=5, metavar="K",
                   help="compare the replicas' weight hashes every K steps (0: only before"
                        " saves)")
    p.add_argument("--no-nonfinite-guard", dest="nonfinite_guard", action="store_false")
    p.add_argument("--loss-spike", type=float, default=3.0, metavar="F",
                   help="roll back when the loss exceeds F x the recent median (0: off)")
    p.add_argument("--max-rollbacks", type=int, default=3)
    p.add_argument("--no-sdc-defences", action="store_true",
                   help="no replica check, no guards, no rollback")
    args = p.parse_args()
    if args.no_sdc_defences:
        args.replica_check_every, args.nonfinite_guard, args.loss_spike = 0, False, 0.0
    return args


def update_manifest(
    directory: str, step: int, name: str, digest: str, keep: int, sync: bool
) -> None:
    entry = {"step": step, "file": name, "sha256": digest}
    for dropped in publish_in_manifest(directory, entry, "file", keep, sync):
        step_of = dropped.removeprefix("step-")
        for name in [dropped, *(f for f in os.listdir(directory)
                                if f.startswith("rank") and f.endswith(f"-step-{step_of}"))]:
            if os.path.exists(os.path.join(directory, name)):
                os.remove(os.path.join(directory, name))


def write_checkpoint(state: dict[str, Any], args: argparse.Namespace) -> None:
    """Rank 0 only. Each --bug branch is a deliberately broken protocol."""
    d, sync, step = args.ckpt_dir, args.bug != "no_fsync", state["step"]
    name = f"step-{step:06d}.pt"
    if args.bug == "write_in_place":
        with open(os.path.join(d, "latest.pt"), "wb") as f:
            write_file(f, lambda out: torch.save(state, out), sync)
        return
    if args.bug == "publish_on_error":
        latest = os.path.join(d, "latest.pt")
        try:
            with open(latest + ".tmp", "wb") as f:
                write_file(f, lambda out: torch.save(state, out), sync)
        finally:  # the bug: an exception mid-write still publishes the partial file
            os.replace(latest + ".tmp", latest)
        return
    if args.bug == "early_pointer":
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        update_manifest(d, step, name, hashlib.sha256(data).hexdigest(), args.keep, sync)
        with open(os.path.join(d, name), "wb") as f:
            write_file(f, lambda out: out.write(data), sync)
        return
    final = atomic_write(d, name, lambda out: torch.save(state, out), sync)
    update_manifest(d, step, name, sha256_file(final), args.keep, sync)


@dataclass
class Trainer:
    """The training state a checkpoint must capture, plus where the run is."""

    args: argparse.Namespace
    device: torch.device
    inner: TinyLM
    model: DistributedDataParallel
    optim: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    step: int = 0
    data_pos: int = 0  # equals step unless a bug (off_by_one) shifts the data
    resumes: int = 0  # how often training resumed from a checkpoint (kept in it)
    loss: float = float("nan")
    extra: torch.Tensor | None = None  # --state-mb: this rank's own state, its own file
    positions: Any = None  # --loader-workers: an iterator over data positions
    positions_next: int = 0  # the position it hands over next

    def parts(self) -> dict[str, Any]:
        return {"model": self.inner, "optim": self.optim, "sched": self.sched}


def save(t: Trainer) -> None:
    """Collective: every rank contributes its RNG state, rank 0 writes."""
    rngs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rngs, rng_state(t.device))
    if t.extra is not None:  # every rank's own file, complete before the step is published
        name = f"rank{dist.get_rank()}-step-{t.step:06d}.pt"
        atomic_write(t.args.ckpt_dir, name, lambda out: torch.save(t.extra, out),
                     t.args.bug != "no_fsync")
        dist.barrier()
    if dist.get_rank() == 0:
        state = {k: v.state_dict() for k, v in t.parts().items()}
        state.update(step=t.step, loss=t.loss, data_pos=t.data_pos, resumes=t.resumes,
                     rng=rngs)
        write_checkpoint(state, t.args)
    # Nobody proceeds (or exits) while rank 0 is still writing.
    dist.barrier()


def choose_checkpoint(args: argparse.Namespace) -> str | None:
    """Rank 0 picks the file to resume from; None means a fresh start."""
    d = args.ckpt_dir
    if args.bug in ("write_in_place", "publish_on_error"):
        path = os.path.join(d, "latest.pt")
        return path if os.path.exists(path) else None
    if not os.path.exists(os.path.join(d, "manifest.json")):
        return None
    entries = sorted(read_manifest(d), key=lambda e: e["step"], reverse=True)
    if args.bug == "early_pointer":
        return os.path.join(d, entries[0]["file"]) if entries else None
    for e in entries:
        path = os.path.join(d, e["file"])
        if not os.path.exists(path):
            print(f"skipping {path}: missing", file=sys.stderr)
        elif args.bug != "no_verify" and sha256_file(path) != e["sha256"]:
            print(f"skipping {path}: sha256 mismatch", file=sys.stderr)
        else:
            return path
    return None


def resume(t: Trainer) -> bool:
    """Load the newest verified checkpoint on every rank; False if there is none."""
    choice = [choose_checkpoint(t.args) if dist.get_rank() == 0 else None]
    # One decision for all ranks, so they cannot resume from different steps.
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return False
    state = torch.load(choice[0], map_location="cpu", weights_only=False)
    skip = {"skip_optim": "optim", "skip_sched": "sched"}.get(t.args.bug)
    for key, part in t.parts().items():
        if key != skip:
            part.load_state_dict(state[key])
    if t.args.bug != "skip_rng":
        set_rng_state(state["rng"][dist.get_rank()], t.device)
    t.step, t.loss = state["step"], state["loss"]
    if t.extra is not None:
        own = os.path.join(t.args.ckpt_dir, f"rank{dist.get_rank()}-step-{t.step:06d}.pt")
        t.extra = torch.load(own, map_location="cpu", weights_only=True)
    t.data_pos = state["data_pos"] + (1 if t.args.bug == "off_by_one" else 0)
    if t.args.bug == "resume_twice":
        t.data_pos += state.get("resumes", 0)
    elif t.args.bug == "replay_data":
        t.data_pos = 0
    t.resumes = state.get("resumes", 0) + 1
    if dist.get_rank() == 0:
        print(f"resumed from {choice[0]} at step {t.step}", flush=True)
    return True


def roll_back(t: Trainer, guard: SdcGuard, reason: str, rollbacks: int) -> None:
    """Every rank: report the corruption and return to the last verified checkpoint."""
    report_detection("sdc", reason=reason, step=t.step)
    if dist.get_rank() == 0:
        print(f"step {t.step}: {reason}; rolling back", flush=True)
    if rollbacks > t.args.max_rollbacks:
        raise RuntimeError(f"corruption persists after {t.args.max_rollbacks} rollbacks")
    if not resume(t):
        # Nothing verified to return to: crash, and the restart begins afresh.
        raise RuntimeError(f"{reason} before the first checkpoint")
    guard.forget()


def train_step(t: Trainer) -> None:
    """One step; the counters move only once the optimizer stepped."""
    step, pos = t.step + 1, next_position(t)
    if t.args.bug == "crash" and dist.get_rank() == 0 and step == t.args.steps // 2:
        raise RuntimeError("planted crash")
    loss = loss_of(t.model, make_batch(t.args.seed, pos, dist.get_rank(), t.device))
    t.optim.zero_grad(set_to_none=True)
    loss.backward()
    t.optim.step()
    t.sched.step()
    t.step, t.data_pos, t.loss = step, pos, loss.item()
    if t.extra is not None:  # the extra state changes every step, as real state does
        t.extra[step % t.extra.numel()] += 1.0


def next_position(t: Trainer) -> int:
    """The next data position; with --loader-workers, as a DataLoader worker hands it over."""
    want = t.data_pos + 1
    if t.args.loader_workers == 0:
        return want
    if t.positions is None or t.positions_next != want:  # first, or after a rollback
        # its own generator: an iterator draws its workers' seed from the global torch
        # RNG otherwise, and a resumed run (which makes one at another point) diverges
        loader = torch.utils.data.DataLoader(
            range(want, 1 << 30), batch_size=None, num_workers=t.args.loader_workers,
            generator=torch.Generator().manual_seed(t.args.seed))
        t.positions = iter(loader)
    got = int(next(t.positions))
    t.positions_next = got + 1
    return got


def go_it_alone(t: Trainer) -> None:
    """The planted split_brain bug's reaction to lost peers (see the module docstring)."""
    print(f"rank {dist.get_rank()}: peers lost after step {t.step}; going on alone", flush=True)
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    t.model = DistributedDataParallel(t.inner, find_unused_parameters=True)


def setup(args: argparse.Namespace) -> Trainer:
    device = init_distributed(collective_timeout(args), args.backend)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    seed_globals(args.seed, dist.get_rank(), from_clock=args.bug == "nondeterministic")
    inner = TinyLM().to(device)
    cuda = device.type == "cuda"
    # DDP rebuilds its gradient buckets after the first step of each process (in the
    # order gradients became ready), and with 3+ ranks the order in which the
    # all-reduce sums a gradient's elements depends on where it sits in its bucket: a
    # resumed process's first step then sums in another order than the uninterrupted
    # run did at that step, and is not bitwise equal. DDP never rebuilds its buckets
    # when it looks for unused parameters (a graph walk per step: cheap here).
    model = DistributedDataParallel(inner, device_ids=[device.index] if cuda else None,
                                    find_unused_parameters=True)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(args.steps))
    trainer = Trainer(args, device, inner, model, optim, sched)
    if args.state_mb > 0:
        generator = torch.Generator().manual_seed(args.seed * 1000 + dist.get_rank())
        trainer.extra = torch.rand(int(args.state_mb * (1 << 20)) // 4, generator=generator)
    return trainer


def main() -> None:
    args = parse_args()
    t = setup(args)
    preempt = Preemption(args.grace)
    watchdog = step_watchdog(args)
    watchdog.step_begins()  # the resume counts as the first step's
    resume(t)
    guard = SdcGuard(args.replica_check_every, args.nonfinite_guard, args.loss_spike, t.device)
    every = args.ckpt_every * (2 if args.bug == "sparse_ckpt" else 1)
    saved, rollbacks = t.step, 0
    while t.step < args.steps:
        try:
            train_step(t)
            watchdog.step_begins()
            if dist.get_rank() == 0 and t.step % 10 == 0:
                print(f"step {t.step} loss {t.loss:.4f}", flush=True)
            time.sleep(args.step_sleep)
            if guard.enabled:
                params = list(t.inner.parameters())
                reason = guard.check(t.step, t.loss, params, replicas=t.step % every == 0)
                if reason:
                    rollbacks += 1
                    roll_back(t, guard, reason, rollbacks)
                    saved = t.step
                    continue
            if t.step % every == 0:
                save(t)
                saved = t.step
            if preempt.agreed(t.device):
                if saved != t.step:
                    save(t)
                # Nonzero so that torchrun restarts the workers, which then resume.
                finish(143, f"preempted at step {t.step}, checkpoint saved", args.grace)
        except RuntimeError:  # a collective failed: a timeout, a closed connection
            if args.bug != "split_brain" or dist.get_world_size() == 1:
                raise
            go_it_alone(t)
    t.positions = None  # its workers are shut down, not left to notice the exit
    finish(0, f"done step {t.step} loss {t.loss!r}", args.grace)


if __name__ == "__main__":
    run(main)
