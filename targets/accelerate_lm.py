"""A Hugging Face Accelerate training script written the way Accelerate's docs show it.

Launched as ``torchrun --standalone --nproc-per-node 2 targets/accelerate_lm.py
[flags]`` (what ``accelerate launch`` runs too): ``Accelerator(cpu=True)`` reads
torchrun's variables and runs DDP over gloo. It trains the tiny LM of
``tiny_lm.py`` (dropout included) on a fixed synthetic token dataset through a
prepared, shuffled DataLoader, calls ``accelerator.save_state`` into
``ckpt/step_N`` every ``--ckpt-every`` steps (model as safetensors, optimizer,
scheduler and every rank's RNG states), and on start ``load_state``s the newest
``step_N`` folder and skips the batches of the epoch already trained on with
``accelerator.skip_first_batches``: the recipe of Accelerate's checkpointing
guide and its ``complete_nlp_example.py``.

What it deliberately does *not* do beyond Accelerate's defaults and that recipe:
no temp folder and rename around ``save_state``, no fsync, no check that the
folder it resumes from is complete, no ``use_seedable_sampler``, no SIGTERM
handler, no collective timeout. The only addition is the one the harness needs
of any target: deterministic kernels on one thread, so that a fault-free run
repeats bitwise. ``--fix rng`` and ``--fix sampler`` add what a user has to add
for an exact resume (README, "Real frameworks as targets").
"""

from __future__ import annotations

import argparse
import os
import re

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed
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
    p.add_argument("--fix", action="append", choices=("rng", "sampler"), default=[],
                   help="rng: give the DataLoader its own generator; sampler: Accelerate's"
                        " seedable sampler, told the epoch")
    return p.parse_args()


def newest_checkpoint(ckpt_dir: str) -> tuple[str, int] | None:
    """The step_N folder with the highest N, as the docs' example picks it."""
    steps = [int(m.group(1)) for name in (os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir)
                                          else [])
             if (m := re.fullmatch(r"step_(\d+)", name))]
    return (os.path.join(ckpt_dir, f"step_{max(steps)}"), max(steps)) if steps else None


def main() -> None:
    args = parse_args()
    # Bitwise repeatable CPU runs: the harness compares against a fault-free run.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    # The seedable sampler shuffles epoch N with seed + N, where the default one draws
    # from a generator whose state save_state does not keep.
    seedable = DataLoaderConfiguration(use_seedable_sampler="sampler" in args.fix)
    accelerator = Accelerator(cpu=True, dataloader_config=seedable)
    set_seed(args.seed)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args.steps))
    # Every new DataLoader iterator draws a base seed from the global torch RNG unless the
    # loader has a generator of its own: a mid-epoch resume would draw it at another step.
    own = {"generator": torch.Generator().manual_seed(args.seed)} if "rng" in args.fix else {}
    loader = DataLoader(token_dataset(args.seed, args.samples), batch_size=8, shuffle=True,
                        **own)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    step = 0
    found = newest_checkpoint(args.ckpt_dir)
    if found:
        accelerator.load_state(found[0])
        step = found[1]
        accelerator.print(f"resumed from {found[0]} at step {step}")

    # Mid-epoch resume: skip what this epoch already trained on (data position = step).
    (epoch, skip), loss = divmod(step, len(loader)), None
    while step < args.steps:
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        if "sampler" in args.fix:
            batches.set_epoch(epoch)
        for inputs, targets in batches:
            loss = loss_of(model, (inputs, targets))
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % args.ckpt_every == 0:
                accelerator.save_state(os.path.join(args.ckpt_dir, f"step_{step}"))
            if step >= args.steps:
                break
        epoch, skip = epoch + 1, 0
    accelerator.print(f"done step {step} loss {loss.item() if loss is not None else None!r}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
