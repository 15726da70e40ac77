"""The agent's cost per training step with no fault firing, vs plain torchrun.

Alternates plain `torchrun` and harness runs (the agent in every rank, the
runner, the history: exactly a chaos run minus the faults) of
`bench/train_ddp.py`, which times its own steps inside its training loop, so
start-up and rendezvous drop out of the comparison. For each model size it
prints the median step time of rank 0 both ways and their ratio, and the
whole-run wall times for reference, and the 10th, 50th and 90th percentiles of every
step of every round (a cost in each step moves all three; a neighbour taking the core
now and then, the 90th).

`--cold` adds a third side: the harness with its ranks exec'd as plain torchrun
starts them (`Job(warm=False)`, what TORCHCHAOS_COLD_START=1 asks for), not forked
from a launcher with torch imported, to tell the agent's cost from the warm start's.

    python bench/overhead.py --sizes small large --repeats 3 [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from torchchaos.harness.runner import Job  # noqa: E402
from torchchaos.scenario.model import Scenario  # noqa: E402

SCRIPT = str(REPO / "bench" / "train_ddp.py")
# small: 1000 steps (4 s), so the first second, while the other processes of a harness run
# settle, does not make the median
STEPS = {"small": 1000, "large": 40}


def plain_run(args: list[str], nproc: int) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as run_dir:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": run_dir,
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", str(nproc), "--monitor-interval", "0.1",
                               SCRIPT, *args],
                              cwd=run_dir, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"plain torchrun failed ({done.returncode}): {done.stderr[-2000:]}")
        wall = time.monotonic() - start
        return wall, json.loads((Path(run_dir) / "step_times.json").read_text())


def harness_run(args: list[str], nproc: int, reference: Path | None,
                warm: bool | None = None) -> tuple[float, list[float]]:
    """A chaos run with no fault (given the reference), or the reference run itself;
    `warm=False`: its ranks exec'd, not forked from a launcher with torch imported
    (None: as the environment says, `TORCHCHAOS_COLD_START`)."""
    with tempfile.TemporaryDirectory() as run_dir:
        outcome = Job(Scenario(script=SCRIPT, args=args, nproc=nproc), Path(run_dir),
                      faults=[], reference=reference, warm=warm).run()
        assert outcome.completed, outcome.log_tail()
        return outcome.wall_seconds, json.loads((Path(run_dir) / "step_times.json").read_text())


def measure(size: str, repeats: int, nproc: int, cold: bool) -> None:
    args = ["--size", size, "--steps", str(STEPS[size])]
    sides = ["plain", "harness", *(["harness, exec'd ranks"] if cold else [])]
    step: dict[str, list[float]] = {side: [] for side in sides}
    wall: dict[str, list[float]] = {side: [] for side in sides}
    every: dict[str, list[float]] = {side: [] for side in sides}  # all steps, all rounds
    with tempfile.TemporaryDirectory() as reference:
        # what a chaos run compares against (its agent loads the step table); made once
        assert Job(Scenario(script=SCRIPT, args=args, nproc=nproc), Path(reference),
                   faults=[]).run().completed
        runs = {"plain": lambda: plain_run(args, nproc),
                "harness": lambda: harness_run(args, nproc, Path(reference)),
                "harness, exec'd ranks": lambda: harness_run(args, nproc, Path(reference),
                                                            warm=False)}
        for number in range(repeats):
            for side in sides:
                seconds, times = runs[side]()
                wall[side].append(seconds)
                step[side].append(statistics.median(times))
                every[side] += times
            print(f"  {size} round {number + 1}: " + "; ".join(
                f"{side} step {step[side][-1] * 1e3:.2f} ms, wall {wall[side][-1]:.2f} s"
                for side in sides), flush=True)
    ps, pw = statistics.median(step["plain"]), statistics.median(wall["plain"])
    for side in sides[1:]:
        hs, hw = statistics.median(step[side]), statistics.median(wall[side])
        print(f"{size}: median step {ps * 1e3:.2f} ms plain, {hs * 1e3:.2f} ms {side},"
              f" ratio {hs / ps:.3f}; wall {pw:.2f} s vs {hw:.2f} s, ratio {hw / pw:.3f}")
    for side in sides:
        tenths = statistics.quantiles(every[side], n=10)
        print(f"{size}: {side} steps p10 {tenths[0] * 1e3:.2f} ms, p50 {tenths[4] * 1e3:.2f} ms,"
              f" p90 {tenths[8] * 1e3:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(STEPS), default=["small", "large"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--cold", action="store_true",
                        help="also the harness with its ranks exec'd, not forked warm")
    ns = parser.parse_args()
    for size in ns.sizes:
        measure(size, ns.repeats, ns.nproc, ns.cold)


if __name__ == "__main__":
    main()
