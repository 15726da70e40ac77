"""Per-step cost of what silent-data-corruption checking adds, for the reference model.

Side by side, in one process, for TinyLM + AdamW (one CPU thread):
1. one training step (forward, backward, AdamW step);
2. the agent's weights snapshot after each step (`torchchaos.rank.weights.save`, kept so
   the blast radius can report the max weight deviation);
3. the defended target's cross-replica check without the all-gather
   (`targets/sdc_guard.weights_hash`: hashing the weights' bytes).

    python bench/sdc_cost.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from reference_step import ReferenceTraining, timed

from torchchaos.rank import weights

from sdc_guard import weights_hash


def main() -> None:
    training = ReferenceTraining.create()
    params = training.params
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rank-0.pt"
        train = timed(training.step, 100)
        snapshot = timed(lambda: weights.save(path, 1, params), 100)
        hashing = timed(lambda: weights_hash(params), 100)
    count = sum(p.numel() for p in params)
    print(f"reference model: {count} parameters; training step {train * 1e3:.2f} ms")
    print(f"weights snapshot {snapshot * 1e3:.2f} ms per step ({snapshot / train:.1%} of a step)")
    print(f"replica weight hash {hashing * 1e3:.2f} ms ({hashing / train:.1%} of a step)")


if __name__ == "__main__":
    main()
