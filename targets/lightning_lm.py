"""A PyTorch Lightning Trainer script written the way Lightning's docs show it.

Launched as ``torchrun --standalone --nproc-per-node 2 targets/lightning_lm.py
[flags]``: the Trainer's ``TorchElasticEnvironment`` picks up torchrun's
variables and ``DDPStrategy(process_group_backend="gloo")`` runs DDP on CPU. A
``LightningModule`` trains the tiny LM of ``tiny_lm.py`` (dropout included) on
a fixed synthetic token dataset (shuffled; Lightning puts a
``DistributedSampler`` under it), a
``ModelCheckpoint(dirpath="ckpt", every_n_train_steps=..., save_last=True)``
callback saves every ``--ckpt-every`` steps, and ``trainer.fit(...,
ckpt_path="last")`` resumes from ``ckpt/last.ckpt`` when it exists (and starts
from scratch, with a warning, when it does not).

What it deliberately does *not* do beyond Lightning's defaults and the docs'
recipe: no RNG state of its own in the checkpoint, no fsync, no SIGTERM
handler of its own (Lightning's stops the fit and the process exits 0), no
collective timeout. The only addition is the one the harness needs
of any target: deterministic kernels on one thread (``deterministic=True``), so
that a fault-free run repeats bitwise. ``--fix`` adds what a user has to add
for an exact resume (README, "Real frameworks as targets").
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
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
    p.add_argument("--fix", action="append", choices=("rng", "data", "sigterm"), default=[],
                   help="rng: checkpoint the torch RNG (on_save_checkpoint / on_load_checkpoint)"
                        " and give the DataLoader its own generator; data: torchdata's"
                        " StatefulDataLoader, whose position Lightning checkpoints (the docs'"
                        " remedy for a mid-epoch resume; it does not restore the batches here,"
                        " README); sigterm: a preempted fit exits 143, not 0")
    return p.parse_args()


class LitLM(L.LightningModule):
    def __init__(self, total_steps: int, keep_rng: bool) -> None:
        super().__init__()
        self.model = TinyLM()
        self.total_steps = total_steps
        self.keep_rng = keep_rng

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        return loss_of(self.model, batch)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(self.total_steps))
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --fix rng: Lightning's checkpoint holds no RNG state; every rank is seeded alike and
    # draws alike, so rank 0's (the one that writes) stands for all.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.keep_rng:
            checkpoint["torch_rng"] = torch.get_rng_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.keep_rng:
            torch.set_rng_state(checkpoint["torch_rng"])


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # bitwise repeatable CPU runs (deterministic=True does the rest)
    L.seed_everything(args.seed)

    # Every new DataLoader iterator draws a base seed from the global torch RNG unless the
    # loader has a generator of its own: a mid-epoch resume would draw it at another step.
    own = {"generator": torch.Generator().manual_seed(args.seed)} if "rng" in args.fix else {}
    loader_class = DataLoader
    if "data" in args.fix:
        # A plain DataLoader has no state: a mid-epoch resume starts the epoch's batches
        # over. Lightning saves and restores the position of a loader with state_dict().
        from torchdata.stateful_dataloader import StatefulDataLoader as loader_class
    loader = loader_class(token_dataset(args.seed, args.samples), batch_size=8, shuffle=True,
                          **own)
    checkpoint = ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.ckpt_every,
                                 save_last=True)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=DDPStrategy(process_group_backend="gloo"),
        devices=local,
        num_nodes=int(os.environ.get("WORLD_SIZE", local)) // local,
        max_steps=args.steps,
        callbacks=[checkpoint],
        deterministic=True,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = LitLM(args.steps, keep_rng="rng" in args.fix)
    try:
        trainer.fit(model, train_dataloaders=loader, ckpt_path="last")
    except SIGTERMException:
        # Lightning stops every rank on a SIGTERM with SIGTERMException, a SystemExit
        # whose code is None: the job exits 0, unfinished, and nothing restarts it.
        if "sigterm" not in args.fix:
            raise
        sys.exit(128 + signal.SIGTERM)
    if trainer.is_global_zero:
        print(f"done step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
