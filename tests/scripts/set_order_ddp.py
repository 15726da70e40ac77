"""plain_ddp.py with one slip: its learning rate follows the order of a set of strings.

That order follows the interpreter's str-hash seed: the same in every run hashed with
one seed, different across seeds (as across restarts in production, where each fresh
interpreter draws its own). plain_ddp.py itself is left as it is: the incident corpus
quotes its line numbers.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import torch

NAMES = ["lr", "momentum", "weight_decay", "dampening", "nesterov", "maximize"]
LR = 0.01 * (1 + list(set(NAMES)).index("lr"))


class SetOrderSGD(torch.optim.SGD):
    def __init__(self, params, lr: float = LR, **kwargs) -> None:  # the script's lr: replaced
        super().__init__(params, lr=LR, **kwargs)


torch.optim.SGD = SetOrderSGD  # plain_ddp.py looks it up when it builds its optimizer
runpy.run_path(str(Path(__file__).with_name("plain_ddp.py")), run_name="__main__")
