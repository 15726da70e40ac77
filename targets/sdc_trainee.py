"""The bundled target's training, as a trainee for SDC detector campaigns.

`torchchaos detectors` runs its trials inside one torchrun job (`torchchaos.sdc.trials`)
and asks a trainee file for its model, optimizer, batches and loss through `build`. This
one is `ddp_lm.py`'s: the tiny causal LM under DDP with AdamW, its seeded batches, and
its own defences (`sdc_guard.SdcGuard` with ddp_lm's defaults: replica hashes every 5
steps, the non-finite guard, a loss-spike factor of 3) as the `target_guard` detector.
Write your own the same way: a function `build(rank, world)` returning its parts by
name (a dict or an object with these attributes: `model`, `optimizer`, `batch`, `loss`,
and optionally `guard` and `params`). Like every bundled target it imports nothing of
torchchaos.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from sdc_guard import SdcGuard
from tiny_lm import TinyLM, loss_of, make_batch

SEED = 0


def build(rank: int, world: int) -> dict[str, object]:
    torch.manual_seed(SEED)  # the same initial weights on every rank, as DDP wants
    device = torch.device("cpu")
    model = DistributedDataParallel(TinyLM().to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return {"model": model, "optimizer": optimizer,
            "batch": lambda step: make_batch(SEED, step, rank, device), "loss": loss_of,
            "guard": SdcGuard(replica_every=5, nonfinite=True, spike_factor=3.0,
                              device=device)}
