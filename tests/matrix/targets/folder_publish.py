"""Small BatchNorm classifier, DDP over gloo, checkpoints as published folders.

Checkpoints are laid out the way many trainers lay them out: one folder per
checkpoint, several files inside. Rank 0 fills `tmp-step-N/`, fsyncs every file
and the folder, then renames it to `step-N/` and fsyncs the parent; resume
takes the highest `step-N`. Every rank reads the same shuffled order
(a DataLoader over a RandomSampler with its own torch.Generator) and keeps its
slice of each global batch; to resume mid-epoch the sampler's generator state
at the start of the epoch and the number of batches done are saved, and the
batches done are skipped.

    torchrun --nproc-per-node 2 folder_publish.py --output-dir outputs/run1

Variants with a planted bug (--variant):
  unpublished_pick   resume takes the newest folder, unfinished tmp-step-N ones too
  restart_from_zero  resume is never attempted: a restart trains from step 0 again
                     and saves its checkpoints over the ones already there
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

VARIANTS = ("correct", "unpublished_pick", "restart_from_zero")
SAMPLES, FEATURES, CLASSES = 48, 16, 3  # 3 batches an epoch: saves land mid-epoch


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_output_dir(path: str) -> None:
    """mkdir -p, making each new folder's entry durable in its parent."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    ensure_output_dir(os.path.dirname(path))
    os.mkdir(path)
    fsync_path(os.path.dirname(path))


def make_data(seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(CLASSES, FEATURES, generator=g) * 2
    labels = torch.randint(0, CLASSES, (SAMPLES,), generator=g)
    x = centers[labels] + torch.randn(SAMPLES, FEATURES, generator=g)
    return TensorDataset(x, labels)


def _save_file(obj: object, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def publish_checkpoint(root: str, step: int, payload: dict, progress: dict) -> None:
    tmp = os.path.join(root, f"tmp-step-{step}")
    final = os.path.join(root, f"step-{step}")
    shutil.rmtree(tmp, ignore_errors=True)  # left over by a save that crashed
    os.mkdir(tmp)
    _save_file(payload["model"], os.path.join(tmp, "model.pt"))
    _save_file({"optimizer": payload["optimizer"], "scheduler": payload["scheduler"]},
               os.path.join(tmp, "optimizer.pt"))
    _save_file(payload["sampler"], os.path.join(tmp, "sampler.pt"))
    with open(os.path.join(tmp, "progress.json"), "w") as f:
        json.dump(progress, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_path(tmp)
    if os.path.exists(final):  # a re-run of this step: replace what is there
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_path(root)


def newest_checkpoint(root: str, variant: str) -> str | None:
    found = {}
    for name in os.listdir(root):
        m = re.search(r"step-(\d+)$", name) if variant == "unpublished_pick" else \
            re.fullmatch(r"step-(\d+)", name)
        if m:
            found[int(m.group(1))] = name
    return os.path.join(root, found[max(found)]) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="outputs/run1")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--variant", choices=VARIANTS, default="correct")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(FEATURES, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, CLASSES)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.95)
    order = torch.Generator().manual_seed(args.seed + 1)
    data = make_data(args.seed)
    loader = DataLoader(data, batch_size=args.global_batch,
                        sampler=RandomSampler(data, generator=order), drop_last=True)

    if rank == 0:
        ensure_output_dir(args.output_dir)
    dist.barrier()

    step, epoch, skip = 0, 0, 0
    epoch_start = order.get_state()
    latest = None if args.variant == "restart_from_zero" else \
        newest_checkpoint(args.output_dir, args.variant)
    if latest is not None:
        model.module.load_state_dict(torch.load(os.path.join(latest, "model.pt")))
        opt_state = torch.load(os.path.join(latest, "optimizer.pt"))
        opt.load_state_dict(opt_state["optimizer"])
        sched.load_state_dict(opt_state["scheduler"])
        sampler_state = torch.load(os.path.join(latest, "sampler.pt"))
        with open(os.path.join(latest, "progress.json")) as f:
            progress = json.load(f)
        step, epoch, skip = progress["step"], progress["epoch"], progress["batches_done"]
        epoch_start = sampler_state["epoch_start"]
        if rank == 0:
            print(f"resuming from {latest}: step {step}, epoch {epoch}, batch {skip}",
                  flush=True)

    model.train()
    while step < args.max_steps:
        order.set_state(epoch_start)
        for batch, (x, y) in enumerate(loader):
            if batch < skip:
                continue
            x, y = x[rank::world], y[rank::world]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=2.0)
            opt.step()
            sched.step()
            step += 1
            if rank == 0:
                print(f"step {step} epoch {epoch} loss {loss.item():.4f}", flush=True)
            if step % args.save_steps == 0:
                if rank == 0:
                    payload = {"model": model.module.state_dict(),
                               "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                               "sampler": {"epoch_start": epoch_start}}
                    progress = {"step": step, "epoch": epoch, "batches_done": batch + 1}
                    publish_checkpoint(args.output_dir, step, payload, progress)
                dist.barrier()
            if step >= args.max_steps:
                break
        else:
            epoch, skip = epoch + 1, 0
            epoch_start = order.get_state()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
