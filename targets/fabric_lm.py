"""A Lightning Fabric training script written the way Fabric's docs show it.

Launched as ``torchrun --standalone --nproc-per-node 2 targets/fabric_lm.py [flags]``:
Fabric's ``TorchElasticEnvironment`` picks up torchrun's variables, the ``ddp``
strategy runs gloo on CPU. It trains the tiny LM of ``tiny_lm.py`` (dropout
included) on a fixed synthetic token dataset through ``fabric.setup_dataloaders``
(shuffled, a ``DistributedSampler`` per rank), saves ``{"model", "optimizer",
"scheduler", "step"}`` with ``fabric.save`` to ``ckpt/step-NNNNNN.ckpt`` every
``--ckpt-every`` steps and, on start, ``fabric.load``s the newest such file and
skips the batches of the epoch that were already trained on.

What it deliberately does *not* do beyond Fabric's defaults and the docs'
recipe: no RNG state in the checkpoint, no ``set_epoch`` of its own, no fsync,
no checksum or validation of the file it resumes from, no SIGTERM handler, no
collective timeout. The only addition is the one the harness needs of any
target: deterministic kernels on one thread, so that a fault-free run repeats
bitwise. ``--fix rng`` and ``--fix epoch`` add what a user has to add for an
exact resume (README, "Real frameworks as targets").
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

from tiny_lm import TinyLM, loss_of, lr_lambda, token_dataset


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=128,
                   help="dataset size; with 2 ranks and batch 8 an epoch is samples/16 steps")
    p.add_argument("--fix", action="append", choices=("rng", "epoch"), default=[],
                   help="rng: checkpoint the torch RNG and give the DataLoader its own generator;"
                        " epoch: restore the epoch Fabric's dataloader wrapper shuffles with")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    # Bitwise repeatable CPU runs: the harness compares against a fault-free run.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    fabric = Fabric(accelerator="cpu", strategy="ddp",
                    devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                    num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", 1)))
    fabric.launch()
    fabric.seed_everything(args.seed)

    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.steps))
    model, optimizer = fabric.setup(model, optimizer)
    # Every new DataLoader iterator draws a base seed from the global torch RNG unless the
    # loader has a generator of its own: a mid-epoch resume would draw it at another step.
    own = {"generator": torch.Generator().manual_seed(args.seed)} if "rng" in args.fix else {}
    loader = fabric.setup_dataloaders(
        DataLoader(token_dataset(args.seed, args.samples), batch_size=8, shuffle=True, **own))

    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
    if "rng" in args.fix:  # a key fabric.load fills in place must be in the dict
        state["rng"] = torch.get_rng_state()
    found = sorted(glob.glob(os.path.join(args.ckpt_dir, "step-*.ckpt")))
    if found:
        fabric.load(found[-1], state)
        fabric.print(f"resumed from {found[-1]} at step {state['step']}")
        if "rng" in args.fix:  # every rank seeded alike and draws alike: rank 0's stands for all
            torch.set_rng_state(state["rng"])
        if "epoch" in args.fix:
            # Fabric shuffles epoch N with the count of iterators its wrapper made in this
            # process (it calls sampler.set_epoch itself, over any call of ours); no public API.
            loader._num_iter_calls = state["step"] // len(loader)

    # Mid-epoch resume: skip what this epoch already trained on (data position = step).
    skip, loss = state["step"] % len(loader), None
    while state["step"] < args.steps:
        for inputs, targets in itertools.islice(loader, skip, None):
            loss = loss_of(model, (inputs, targets))
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            scheduler.step()
            state["step"] += 1
            if state["step"] % args.ckpt_every == 0:
                if "rng" in args.fix:
                    state["rng"] = torch.get_rng_state()
                fabric.save(os.path.join(args.ckpt_dir, f"step-{state['step']:06d}.ckpt"), state)
            if state["step"] >= args.steps:
                break
        skip = 0
    fabric.print(f"done step {state['step']} loss {loss.item() if loss is not None else None!r}")


if __name__ == "__main__":
    main()
