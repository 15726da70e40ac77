"""A small torchft DDP job written the way torchft's users write one: one replica group
under torchrun, torchft's Manager, DDP wrapper and Optimizer over gloo, a lighthouse at
$TORCHFT_LIGHTHOUSE. No checkpoint on disk: a group that dies whole starts over."""

import os
from datetime import timedelta

import torch
from torch import nn
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

STEPS = 12


def main() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    inner = torch.optim.SGD(net.parameters(), lr=0.05)

    def state_dict():
        return {"model": net.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state):
        net.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    group = os.environ.get("REPLICA_GROUP_ID", "0")
    manager = Manager(pg=ProcessGroupGloo(), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"g{group}", timeout=timedelta(seconds=10))
    model = DistributedDataParallel(manager, net)
    optimizer = Optimizer(manager, inner)
    while manager.current_step() < STEPS:
        g = torch.Generator().manual_seed(manager.current_step() * 100 + int(os.environ["RANK"]))
        x = torch.randn(16, 8, generator=g)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin())
        loss.backward()
        optimizer.step()
    print("done", manager.current_step(), flush=True)


if __name__ == "__main__":
    main()
