"""The final weights of a run, kept so a corruption's blast radius can be measured.

Digests say *whether* two runs differ; how far the weights drifted needs the
numbers. Each rank overwrites one small file after every step (atomically,
under `_chaos/`), so the file of a finished run holds its last step. Models
above `LIMIT_BYTES` per rank are skipped: writing them every step would cost
more than the answer is worth, and the blast radius then says "not measured".
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

LIMIT_BYTES = 8 << 20


def local_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's part of each tensor (a DTensor's local shard)."""
    out = []
    for t in tensors:
        to_local = getattr(t, "to_local", None)
        out.append((to_local() if callable(to_local) else t).detach())
    return out


def small_enough(tensors: list[torch.Tensor]) -> bool:
    return sum(t.numel() * t.element_size() for t in local_tensors(tensors)) <= LIMIT_BYTES


def save(path: Path, step: int, tensors: list[torch.Tensor]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "tensors": [t.cpu() for t in local_tensors(tensors)]}, tmp)
    os.replace(tmp, path)


def load(path: Path) -> tuple[int, list[torch.Tensor]] | None:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError):
        return None
    return data["step"], data["tensors"]


def max_deviation(mine: list[torch.Tensor], reference: list[torch.Tensor]) -> float | None:
    """Largest absolute elementwise difference (inf / nan where those appeared);
    None if the two do not line up (different shapes or counts)."""
    if len(mine) != len(reference):
        return None
    worst = 0.0
    for a, b in zip(mine, reference):
        if a.shape != b.shape:
            return None
        if a.numel() == 0:
            continue
        diff = (a.double() - b.double()).abs()
        if diff.isnan().any():
            return float("nan")
        worst = max(worst, float(diff.max()))
    return worst
