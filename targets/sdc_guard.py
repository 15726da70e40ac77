"""Defences against silent data corruption, small enough to copy into a training loop.

Three checks, each cheap and each switchable off:
- cross-replica fingerprint: data-parallel replicas must hold bitwise equal
  weights; every rank hashes its parameters and the ranks compare the hashes
  (an all-gather of 8 bytes each). It catches a corruption of one replica's
  weights or optimizer state; it cannot see one that the all-reduce spread to
  every replica (a gradient corrupted before it);
- non-finite guard: a NaN or inf loss;
- loss-spike guard: a loss far above the recent ones.

`SdcGuard.check` is collective (every rank must call it at the same step) and
returns one verdict for all ranks, so they roll back together. Run the replica
check before every checkpoint save as well: a checkpoint must never hold state
that has not been checked, or rolling back restores the corruption.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import deque

import torch
import torch.distributed as dist


def weights_hash(params: list[torch.Tensor]) -> int:
    """A 63-bit hash of the parameters' exact bytes (on the host)."""
    h = hashlib.blake2b(digest_size=8)
    for p in params:
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return int.from_bytes(h.digest(), "little") >> 1


class SdcGuard:
    def __init__(self, replica_every: int, nonfinite: bool, spike_factor: float,
                 device: torch.device, window: int = 8) -> None:
        self.replica_every = replica_every  # 0: only when asked (before saves)
        self.nonfinite = nonfinite
        self.spike_factor = spike_factor  # 0: off
        self.device = device
        self.recent: deque[float] = deque(maxlen=window)

    @property
    def enabled(self) -> bool:
        return bool(self.replica_every or self.nonfinite or self.spike_factor)

    def check(self, step: int, loss: float, params: list[torch.Tensor],
              replicas: bool = False) -> str | None:
        """What looks corrupted on any rank after `step`, or None. Collective."""
        reason = self._local(loss)
        if replicas or (self.replica_every and step % self.replica_every == 0):
            # Every rank must take part whatever it found locally: skipping the
            # all-gather on one rank would leave the others waiting in it.
            differ = self._replicas_differ(params)
            reason = reason or differ
        flag = torch.tensor([1.0 if reason else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and not reason:
            reason = "another rank saw a corruption"
        if not reason and math.isfinite(loss):
            self.recent.append(loss)
        return reason

    def forget(self) -> None:
        """After a rollback: the losses seen since are not history any more."""
        self.recent.clear()

    def _local(self, loss: float) -> str | None:
        if self.nonfinite and not math.isfinite(loss):
            return f"non-finite loss {loss}"
        if self.spike_factor and len(self.recent) >= 3:
            typical = statistics.median(self.recent)
            if loss > self.spike_factor * typical:
                return f"loss spike {loss:.4g} > {self.spike_factor:g} x {typical:.4g}"
        return None

    def _replicas_differ(self, params: list[torch.Tensor]) -> str | None:
        mine = torch.tensor([weights_hash(params)], dtype=torch.int64, device=self.device)
        hashes = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(hashes, mine)
        values = [int(h.item()) for h in hashes]
        if len(set(values)) > 1:
            odd = [r for r, v in enumerate(values) if values.count(v) < len(values) / 2 + 0.5]
            return f"replica weights differ (rank(s) {odd or 'unknown'} disagree)"
        return None
