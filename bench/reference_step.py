"""What the per-step benchmarks share: a timer and the reference model's training step.

Imported by name from the benchmark scripts (run as scripts, their folder is
on `sys.path`).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "targets"))  # the targets import their siblings by name

from tiny_lm import TinyLM  # noqa: E402


def timed(fn: Callable[[], object], repeats: int = 50) -> float:
    """Median seconds of `fn` over `repeats` calls, after one warm-up call."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


@dataclass
class ReferenceTraining:
    """TinyLM + AdamW on one CPU thread, one fixed batch: the bundled target's step."""

    model: TinyLM
    optim: torch.optim.Optimizer
    tokens: torch.Tensor

    @classmethod
    def create(cls) -> ReferenceTraining:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = TinyLM()
        return cls(model, torch.optim.AdamW(model.parameters(), lr=3e-3),
                   torch.randint(0, 64, (8, 17)))

    @property
    def params(self) -> list[torch.Tensor]:
        return [p for g in self.optim.param_groups for p in g["params"]]

    def step(self) -> None:
        logits = self.model(self.tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64),
                                                 self.tokens[:, 1:].reshape(-1))
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
