"""Per-step cost of what silent-data-corruption checking adds, for the reference model.

Side by side, in one process, for TinyLM + AdamW (one CPU thread):
1. one training step (forward, backward, AdamW step);
2. the agent's weights snapshot after each step (`chaos.weights.save`, kept so
   the blast radius can report the max weight deviation);
3. the defended target's cross-replica check without the all-gather
   (`targets/sdc_guard.weights_hash`: hashing the weights' bytes).

    python bench/sdc_cost.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "targets"))  # the targets import their siblings by name

from chaos import weights  # noqa: E402

from sdc_guard import weights_hash  # noqa: E402
from tiny_lm import TinyLM  # noqa: E402


def timed(fn, repeats: int = 100) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM()
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 64, (8, 17))
    params = list(model.parameters())

    def step() -> None:
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rank-0.pt"
        train = timed(step)
        snapshot = timed(lambda: weights.save(path, 1, params))
        hashing = timed(lambda: weights_hash(params))
    count = sum(p.numel() for p in params)
    print(f"reference model: {count} parameters; training step {train * 1e3:.2f} ms")
    print(f"weights snapshot {snapshot * 1e3:.2f} ms per step ({snapshot / train:.1%} of a step)")
    print(f"replica weight hash {hashing * 1e3:.2f} ms ({hashing / train:.1%} of a step)")


if __name__ == "__main__":
    main()
