"""Reference target: a tiny DDP language model with careful checkpoint/resume.

Launched as ``torchrun --standalone --nproc-per-node 2 targets/ddp_lm.py [flags]``
from a fresh run directory. With identical flags it is bitwise deterministic on
CPU, and a run that is killed and resumed ends in exactly the same state as an
uninterrupted one: checkpoints hold model, optimizer, scheduler, step and the
RNG states (torch, CUDA, numpy, python) of every rank, are written atomically
(temp file + fsync + os.replace + directory fsync) and are listed with their
sha256 in ``manifest.json``. SIGTERM asks for a checkpoint at the end of the
current step and an exit with status 143, so torchrun restarts the workers.

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
- ``nondeterministic``: global RNGs are seeded from the clock.
- ``crash``: rank 0 raises RuntimeError at step --steps // 2.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import IO, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

VOCAB, SEQ, BATCH, D_MODEL, HEADS, FF, LAYERS = 64, 16, 8, 32, 2, 64, 2
WARMUP = 5
BUGS = (
    "none",
    "write_in_place",  # torn latest.pt
    "skip_rng",
    "skip_optim",
    "skip_sched",
    "off_by_one",  # skips a batch on resume
    "sparse_ckpt",  # saves half as often as advertised
    "early_pointer",  # manifest before data
    "no_fsync",
    "nondeterministic",
    "crash",
)


class TinyLM(nn.Module):
    """Decoder-only transformer: encoder layers under a causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.1, batch_first=True)
            for _ in range(LAYERS)
        )
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(n, device=x.device))
        # Built per call rather than as a buffer so DDP has no buffers to broadcast.
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(h)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="process group timeout (s)")
    p.add_argument("--grace", type=int, default=20, help="seconds allowed after SIGTERM")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--bug", choices=BUGS, default="none")
    return p.parse_args()


class Preemption:
    """SIGTERM only sets a flag: saving inside a signal handler is unsafe."""

    def __init__(self, grace: int) -> None:
        self.requested = False
        self.grace = grace
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if not self.requested:
            # If the checkpoint cannot finish in time, SIGALRM kills us anyway.
            signal.alarm(self.grace)
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        # Every rank must take the same branch or the next collective hangs.
        flag = torch.tensor([float(self.requested)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def seed_globals(seed: int, rank: int, bug: str) -> None:
    base = time.time_ns() % 2**31 if bug == "nondeterministic" else seed
    torch.manual_seed(base + rank)
    np.random.seed(base + rank)
    random.seed(base + rank)


def make_batch(
    seed: int, pos: int, rank: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch at data position `pos`: a seeded generator makes it replayable."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + pos * 1009 + rank)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    stride = torch.randint(1, 4, (BATCH, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    # The global numpy and python RNGs are used on purpose, so that resume is
    # only exact if their states are checkpointed too.
    noisy = torch.from_numpy(np.random.random((BATCH, SEQ)) < 0.1)
    noise = torch.from_numpy(np.random.randint(0, VOCAB, (BATCH, SEQ))).long()
    seq = torch.roll(seq, shifts=random.randint(0, 3), dims=1)
    inputs = torch.where(noisy, noise, seq[:, :-1])
    return inputs.to(device), seq[:, 1:].to(device)


def lr_lambda(total: int) -> Callable[[int], float]:
    def factor(i: int) -> float:
        if i < WARMUP:
            return (i + 1) / WARMUP
        return max(0.0, (total - i) / max(1, total - WARMUP))

    return factor


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: str, sync: bool) -> None:
    # A rename is only durable once the directory entry itself is on disk.
    if sync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_file(f: IO[bytes], write: Callable[[IO[bytes]], None], sync: bool) -> None:
    write(f)
    f.flush()
    if sync:
        os.fsync(f.fileno())


def atomic_write(directory: str, name: str, write: Callable[[IO[bytes]], None], sync: bool) -> str:
    """Write to a temp file in the same dir, then rename it over `name`."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        write_file(f, write, sync)
    final = os.path.join(directory, name)
    os.replace(tmp, final)
    fsync_dir(directory, sync)
    return final


def read_manifest(directory: str) -> list[dict[str, Any]]:
    with open(os.path.join(directory, "manifest.json")) as f:
        return json.load(f)["checkpoints"]


def update_manifest(
    directory: str, step: int, name: str, digest: str, keep: int, sync: bool
) -> None:
    path = os.path.join(directory, "manifest.json")
    old = read_manifest(directory) if os.path.exists(path) else []
    # Entries at or after `step` belong to a timeline we resumed away from.
    entries = [e for e in old if e["step"] < step]
    entries.append({"step": step, "file": name, "sha256": digest})
    kept = entries[-keep:]
    body = json.dumps({"checkpoints": kept}, indent=1).encode()
    atomic_write(directory, "manifest.json", lambda out: out.write(body), sync)
    # Delete only after the manifest stops pointing at the files.
    live = {e["file"] for e in kept}
    for e in old + entries:
        if e["file"] not in live and os.path.exists(os.path.join(directory, e["file"])):
            os.remove(os.path.join(directory, e["file"]))


def write_checkpoint(state: dict[str, Any], args: argparse.Namespace) -> None:
    """Rank 0 only. Each --bug branch is a deliberately broken protocol."""
    d, sync, step = args.ckpt_dir, args.bug != "no_fsync", state["step"]
    name = f"step-{step:06d}.pt"
    if args.bug == "write_in_place":
        with open(os.path.join(d, "latest.pt"), "wb") as f:
            write_file(f, lambda out: torch.save(state, out), sync)
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


def save(
    step: int,
    loss: float,
    data_pos: int,
    parts: dict[str, Any],
    args: argparse.Namespace,
    device: torch.device,
) -> None:
    """Collective: every rank contributes its RNG state, rank 0 writes."""
    rngs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rngs, rng_state(device))
    if dist.get_rank() == 0:
        state = {k: v.state_dict() for k, v in parts.items()}
        state.update(step=step, loss=loss, data_pos=data_pos, rng=rngs)
        write_checkpoint(state, args)
    # Nobody proceeds (or exits) while rank 0 is still writing.
    dist.barrier()


def choose_checkpoint(args: argparse.Namespace) -> str | None:
    """Rank 0 picks the file to resume from; None means a fresh start."""
    d = args.ckpt_dir
    if args.bug == "write_in_place":
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
        elif sha256_file(path) != e["sha256"]:
            print(f"skipping {path}: sha256 mismatch", file=sys.stderr)
        else:
            return path
    return None


def resume(
    parts: dict[str, Any], args: argparse.Namespace, device: torch.device
) -> tuple[int, int, float]:
    """Returns (last finished step, last data position, its loss)."""
    choice = [choose_checkpoint(args) if dist.get_rank() == 0 else None]
    # One decision for all ranks, so they cannot resume from different steps.
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return 0, 0, float("nan")
    state = torch.load(choice[0], map_location="cpu", weights_only=False)
    skip = {"skip_optim": "optim", "skip_sched": "sched"}.get(args.bug)
    for key, part in parts.items():
        if key != skip:
            part.load_state_dict(state[key])
    if args.bug != "skip_rng":
        set_rng_state(state["rng"][dist.get_rank()], device)
    extra = 1 if args.bug == "off_by_one" else 0
    if dist.get_rank() == 0:
        print(f"resumed from {choice[0]} at step {state['step']}", flush=True)
    return state["step"], state["data_pos"] + extra, state["loss"]


def train_step(
    model: nn.Module,
    optim: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    inputs: torch.Tensor,
    targets: torch.Tensor,
) -> float:
    logits = model(inputs)
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    optim.zero_grad(set_to_none=True)
    loss.backward()
    optim.step()
    sched.step()
    return loss.item()


def setup(args: argparse.Namespace) -> tuple[int, torch.device]:
    # cuBLAS reads this when its first handle is created; it must be set before
    # any CUDA work to make GEMMs deterministic.
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout)
    )
    os.makedirs(args.ckpt_dir, exist_ok=True)
    return dist.get_rank(), device


def finish(code: int, message: str) -> int:
    if dist.get_rank() == 0:
        print(message, flush=True)
    dist.destroy_process_group()
    return code


KEEP_ALIVE: list[object] = []


def exit_now(code: int) -> None:
    """Exit without interpreter teardown.

    At teardown the DDP reducer can free the gloo process group while holding
    the GIL, and join a gloo worker thread that is waiting for the GIL to free a
    tensor: a deadlock that was seen here (one rank hung after "done"). The
    same happens when main() returns and its locals are freed, so the DDP
    module is kept alive in KEEP_ALIVE until os._exit ends the process.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> int:
    args = parse_args()
    rank, device = setup(args)
    seed_globals(args.seed, rank, args.bug)
    preempt = Preemption(args.grace)
    inner = TinyLM().to(device)
    model = DistributedDataParallel(
        inner, device_ids=[device.index] if device.type == "cuda" else None
    )
    KEEP_ALIVE.append(model)  # never freed before os._exit: see exit_now
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(args.steps))
    parts = {"model": inner, "optim": optim, "sched": sched}
    step, data_pos, loss = resume(parts, args, device)
    every = args.ckpt_every * (2 if args.bug == "sparse_ckpt" else 1)
    saved = step
    while step < args.steps:
        step, data_pos = step + 1, data_pos + 1
        if args.bug == "crash" and rank == 0 and step == args.steps // 2:
            raise RuntimeError("planted crash")
        batch = make_batch(args.seed, data_pos, rank, device)
        loss = train_step(model, optim, sched, *batch)
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss:.4f}", flush=True)
        time.sleep(args.step_sleep)
        if step % every == 0:
            save(step, loss, data_pos, parts, args, device)
            saved = step
        if preempt.agreed(device):
            if saved != step:
                save(step, loss, data_pos, parts, args, device)
            # Nonzero so that torchrun restarts the workers, which then resume.
            return finish(143, f"preempted at step {step}, checkpoint saved")
    return finish(0, f"done step {step} loss {loss!r}")


if __name__ == "__main__":
    try:
        status = main()
    except Exception:
        traceback.print_exc()
        status = 1
    exit_now(status)
