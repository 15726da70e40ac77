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
- ``no_verify``: resume trusts the newest checkpoint the manifest names without
  checking its sha256, so bit rot in it is loaded as if it were training state.
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
from dataclasses import dataclass
from typing import IO, Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

VOCAB, SEQ, BATCH, D_MODEL, HEADS, FF, LAYERS = 64, 16, 8, 32, 2, 64, 2
WARMUP = 5
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
    loss: float = float("nan")

    def parts(self) -> dict[str, Any]:
        return {"model": self.inner, "optim": self.optim, "sched": self.sched}


def save(t: Trainer) -> None:
    """Collective: every rank contributes its RNG state, rank 0 writes."""
    rngs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rngs, rng_state(t.device))
    if dist.get_rank() == 0:
        state = {k: v.state_dict() for k, v in t.parts().items()}
        state.update(step=t.step, loss=t.loss, data_pos=t.data_pos, rng=rngs)
        write_checkpoint(state, t.args)
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
        elif args.bug != "no_verify" and sha256_file(path) != e["sha256"]:
            print(f"skipping {path}: sha256 mismatch", file=sys.stderr)
        else:
            return path
    return None


def resume(t: Trainer) -> None:
    choice = [choose_checkpoint(t.args) if dist.get_rank() == 0 else None]
    # One decision for all ranks, so they cannot resume from different steps.
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return
    state = torch.load(choice[0], map_location="cpu", weights_only=False)
    skip = {"skip_optim": "optim", "skip_sched": "sched"}.get(t.args.bug)
    for key, part in t.parts().items():
        if key != skip:
            part.load_state_dict(state[key])
    if t.args.bug != "skip_rng":
        set_rng_state(state["rng"][dist.get_rank()], t.device)
    t.step, t.loss = state["step"], state["loss"]
    t.data_pos = state["data_pos"] + (1 if t.args.bug == "off_by_one" else 0)
    if dist.get_rank() == 0:
        print(f"resumed from {choice[0]} at step {t.step}", flush=True)


def train_step(t: Trainer) -> None:
    t.step, t.data_pos = t.step + 1, t.data_pos + 1
    if t.args.bug == "crash" and dist.get_rank() == 0 and t.step == t.args.steps // 2:
        raise RuntimeError("planted crash")
    inputs, targets = make_batch(t.args.seed, t.data_pos, dist.get_rank(), t.device)
    logits = t.model(inputs)
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    t.optim.zero_grad(set_to_none=True)
    loss.backward()
    t.optim.step()
    t.sched.step()
    t.loss = loss.item()


def setup(args: argparse.Namespace) -> Trainer:
    # cuBLAS reads this when its first handle is created; it must be set before
    # any CUDA work to make GEMMs deterministic.
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    seed_globals(args.seed, dist.get_rank(), args.bug)
    inner = TinyLM().to(device)
    model = DistributedDataParallel(inner, device_ids=[device.index] if cuda else None)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(args.steps))
    return Trainer(args, device, inner, model, optim, sched)


def finish(code: int, message: str, grace: int) -> NoReturn:
    """Print, tear down the process group and exit with `code`, skipping teardown.

    Interpreter teardown (or just returning from main) frees the DDP reducer,
    whose gloo process group then joins its worker threads while holding the
    GIL; a worker still freeing the last collective's tensor needs the GIL, so
    both wait forever. That hang was seen here, so never free them: os._exit.
    """
    # Last-resort watchdog: a stuck destroy must not turn into a hung job.
    signal.alarm(grace)
    if dist.get_rank() == 0:
        print(message, flush=True)
    dist.destroy_process_group()
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    args = parse_args()
    t = setup(args)
    preempt = Preemption(args.grace)
    resume(t)
    every = args.ckpt_every * (2 if args.bug == "sparse_ckpt" else 1)
    saved = t.step
    while t.step < args.steps:
        train_step(t)
        if dist.get_rank() == 0 and t.step % 10 == 0:
            print(f"step {t.step} loss {t.loss:.4f}", flush=True)
        time.sleep(args.step_sleep)
        if t.step % every == 0:
            save(t)
            saved = t.step
        if preempt.agreed(t.device):
            if saved != t.step:
                save(t)
            # Nonzero so that torchrun restarts the workers, which then resume.
            finish(143, f"preempted at step {t.step}, checkpoint saved", args.grace)
    finish(0, f"done step {t.step} loss {t.loss!r}", args.grace)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        # The traceback still holds main's frame, so this exit frees nothing.
        exit_now(1)
