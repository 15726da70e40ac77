"""Distributed PyTorch-Ignite trainer: a small MLP on synthetic data, resumable checkpoints.

Written apart, as the fourth held-out target of the incident import (issue 38): by a
helper that did not read the import's readers. Scored blind before any fix
(bench/README.md, 2026-11-28, fifth session): 5 of 20 exact, 0 wrong. Needs
pytorch-ignite (the `frameworks` extra). As Ignite's plain `Engine` does, a resume in
the middle of an epoch feeds that epoch's first batches again.

Written in the style of Ignite's own distributed examples: an ``Engine`` with event handlers,
``ignite.distributed`` (``idist``) for the process group, DDP model, optimizer and data loader,
the ``Checkpoint`` handler with ``DiskSaver`` every K iterations, ``Checkpoint.load_objects`` to
resume from the newest ``checkpoints/checkpoint_<iteration>.pt``, and ``setup_logger`` for logs
(rank 0 only, on stderr). Launch with::

    torchrun --nproc-per-node 2 ignite_trainer.py --steps 20 --ckpt-every 5

``--steps`` is the total number of iterations across restarts. Relative paths are taken from the
current working directory.
"""

import argparse
import re
from pathlib import Path

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import Checkpoint, DiskSaver
from ignite.utils import manual_seed, setup_logger
from torch import nn
from torch.utils.data import TensorDataset

CKPT_DIR = Path("checkpoints")
CKPT_PATTERN = re.compile(r"^checkpoint_(\d+)\.pt$")
SEED = 1234
N_SAMPLES, N_FEATURES, N_CLASSES = 192, 64, 10
BATCH_SIZE = 32  # global batch size; idist.auto_dataloader divides it by the world size


def make_dataset() -> TensorDataset:
    """A fixed synthetic classification set, identical on every rank and every run."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(N_SAMPLES, N_FEATURES, generator=g)
    w_true = torch.randn(N_FEATURES, N_CLASSES, generator=g)
    y = (x @ w_true + 0.5 * torch.randn(N_SAMPLES, N_CLASSES, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def make_model() -> nn.Module:
    # 64*512 + 512*256 + 256*10 weights + biases = 167,178 parameters (~0.67 MB in float32)
    return nn.Sequential(
        nn.Linear(N_FEATURES, 512), nn.ReLU(),
        nn.Linear(512, 256), nn.ReLU(),
        nn.Linear(256, N_CLASSES),
    )


def find_latest_checkpoint() -> Path | None:
    """Newest ``checkpoint_<iteration>.pt`` in CKPT_DIR (by iteration number), or None."""
    if not CKPT_DIR.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in CKPT_DIR.iterdir() if (m := CKPT_PATTERN.match(p.name))]
    return max(found)[1] if found else None


def training(local_rank: int, args: argparse.Namespace) -> None:
    rank, world_size = idist.get_rank(), idist.get_world_size()
    logger = setup_logger(name="ignite_trainer")  # handlers on rank 0 only, silent elsewhere
    manual_seed(SEED + rank)  # seeds random, torch and numpy; parameters are broadcast by DDP

    train_loader = idist.auto_dataloader(
        make_dataset(), batch_size=BATCH_SIZE, shuffle=True, num_workers=0, drop_last=True
    )
    model = idist.auto_model(make_model())
    optimizer = idist.auto_optim(torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01))
    criterion = nn.CrossEntropyLoss()
    device = idist.device()

    def train_step(engine: Engine, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        model.train()
        x, y = batch[0].to(device), batch[1].to(device)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        # report the mean loss over all ranks so that the logged value does not depend on the rank
        return idist.all_reduce(loss.detach().clone()).item() / world_size

    trainer = Engine(train_step)
    trainer.logger = setup_logger(name="trainer")  # Ignite's own "Engine run ..." lines

    @trainer.on(Events.EPOCH_STARTED)
    def set_sampler_epoch(engine: Engine) -> None:
        # DistributedSampler needs the epoch to reshuffle; Ignite's common.py does the same
        train_loader.sampler.set_epoch(engine.state.epoch - 1)

    @trainer.on(Events.ITERATION_COMPLETED)
    def log_training_loss(engine: Engine) -> None:
        logger.info(
            f"Epoch[{engine.state.epoch}] Iteration[{engine.state.iteration}/{args.steps}] "
            f"Loss: {engine.state.output:.4f}"
        )

    to_save = {"model": model, "optimizer": optimizer, "trainer": trainer}
    checkpointer = Checkpoint(
        to_save,
        save_handler=DiskSaver(str(CKPT_DIR), create_dir=True, require_empty=False),
        n_saved=2,
        global_step_transform=lambda engine, _event: engine.state.iteration,
        include_self=True,  # keeps the n_saved bookkeeping across restarts
    )
    trainer.add_event_handler(Events.ITERATION_COMPLETED(every=args.ckpt_every), checkpointer)

    @trainer.on(Events.ITERATION_COMPLETED(every=args.ckpt_every))
    def log_checkpoint(engine: Engine) -> None:  # runs after the checkpointer (attached first)
        logger.info(
            f"Saved checkpoint {checkpointer.last_checkpoint} "
            f"at iteration {engine.state.iteration}"
        )

    @trainer.on(Events.COMPLETED)
    def log_done(engine: Engine) -> None:
        logger.info(
            f"Training complete: {engine.state.iteration} iterations, "
            f"final loss {engine.state.output:.4f}"
        )

    # Resume: rank 0 picks the newest file and broadcasts its name; every rank loads it.
    latest = find_latest_checkpoint() if rank == 0 else None
    latest_name = idist.broadcast(str(latest) if latest else "", src=0, safe_mode=True)
    if latest_name:
        Checkpoint.load_objects(
            to_load={**to_save, "checkpointer": checkpointer}, checkpoint=latest_name
        )
        logger.info(
            f"Resuming from checkpoint {latest_name} at iteration {trainer.state.iteration} "
            f"(epoch {trainer.state.epoch})"
        )
    else:
        logger.info(f"No checkpoint in {CKPT_DIR}/, starting fresh from iteration 0")

    if trainer.state.iteration >= args.steps:
        # Engine.run would start a new run from iteration 0 when the loaded state is already done.
        logger.info(f"Nothing to do: already at iteration {trainer.state.iteration}"
                    f" >= {args.steps}")
        return
    trainer.run(train_loader, max_iters=args.steps)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="total training iterations")
    p.add_argument("--ckpt-every", type=int, default=5, metavar="K",
                   help="save a checkpoint every K iterations")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    with idist.Parallel(backend="gloo") as parallel:
        parallel.run(training, args)


if __name__ == "__main__":
    main()
