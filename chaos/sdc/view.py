"""What a detector sees and is: one training step's view, the class every detector
extends, and the bitwise comparisons they share (`detectors` holds the reference
detectors, `megatron` the field's public one)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class StepView:
    """One step as a detector sees it, after backward and before the optimizer step."""

    step: int
    loss: float  # this rank's
    params: list[torch.Tensor]
    rerun: Callable[[], tuple[float, list[torch.Tensor]]]  # the loss and gradients again


class Detector:
    name = "detector"
    action = "roll back"  # what a job does when it fires
    # what the job did next, where the detector decides it per step (else None)
    decision: str | None = None

    def check(self, view: StepView) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


def weights_hash(params: list[torch.Tensor]) -> int:
    """A 63-bit hash of the parameters' exact bytes."""
    h = hashlib.blake2b(digest_size=8)
    for p in params:
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (a NaN equals the same NaN: `torch.equal` would call them different)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.detach().contiguous().view(torch.uint8), b.detach().contiguous().view(torch.uint8))
