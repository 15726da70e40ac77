"""A training script shaped like PyTorch's "fault-tolerant training with torchrun"
tutorial: a Trainer class, a snapshot that rank 0 writes with `torch.save` at the end
of every `save_every`-th epoch, and a restart that loads the snapshot when it exists.

As in the tutorial, the data set is drawn with `torch.rand` and nothing is seeded, so
two runs train on different data. `--fix seed` seeds it (what `torchchaos doctor`
asks for). Run as `ddp_tutorial.py TOTAL_EPOCHS SAVE_EVERY [--batch_size N]`.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomPairs(Dataset):
    def __init__(self, size: int) -> None:
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index]


class Trainer:
    def __init__(self, model: torch.nn.Module, data: DataLoader,
                 optimizer: torch.optim.Optimizer, save_every: int, snapshot_path: str) -> None:
        self.rank = int(os.environ["LOCAL_RANK"])
        self.model = model
        self.data = data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DistributedDataParallel(self.model)

    def _load_snapshot(self, path: str) -> None:
        snapshot = torch.load(path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"resuming training from snapshot at epoch {self.epochs_run}", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> None:
        self.data.sampler.set_epoch(epoch)
        for source, targets in self.data:
            self._run_batch(source, targets)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--fix", action="append", default=[], choices=["seed"])
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    if "seed" in args.fix:
        torch.manual_seed(0)
    dataset = RandomPairs(256)
    data = DataLoader(dataset, batch_size=args.batch_size, shuffle=False,
                      sampler=DistributedSampler(dataset))
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    Trainer(model, data, optimizer, args.save_every, "snapshot.pt").train(args.total_epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
