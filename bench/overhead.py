"""Wall time of a fault-free run under the harness vs plain torchrun, side by side.

Alternates plain and harness runs of the same script and arguments (so drift
in machine load hits both alike) and prints the medians and their ratio. The
harness run is exactly what a chaos run does minus the faults: the agent in
every rank (step hooks, fingerprints, I/O watch, history) and the runner.

    python bench/overhead.py --repeats 5 -- targets/ddp_lm.py --steps 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chaos.history import History  # noqa: E402
from chaos.runner import Job  # noqa: E402
from chaos.scenario import Scenario  # noqa: E402


def plain_run(script: str, args: list[str], nproc: int) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": run_dir,
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(nproc), "--monitor-interval", "0.1",
                        str(Path(script).resolve()), *args],
                       cwd=run_dir, env=env, check=True, capture_output=True)
        return time.monotonic() - start


def harness_run(script: str, args: list[str], nproc: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as run_dir:
        scenario = Scenario(script=script, args=args, nproc=nproc)
        outcome = Job(scenario, Path(run_dir), faults=[]).run()
        assert outcome.completed, outcome.log_tail()
        steps = History.of_run(Path(run_dir)).steps(rank=0)
        per_step = (steps[-1]["t"] - steps[0]["t"]) / max(len(steps) - 1, 1)
        return outcome.wall_seconds, per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    plain, harness, steps = [], [], []
    for number in range(ns.repeats):
        plain.append(plain_run(ns.script, args, ns.nproc))
        wall, per_step = harness_run(ns.script, args, ns.nproc)
        harness.append(wall)
        steps.append(per_step)
        print(f"round {number + 1}: plain {plain[-1]:.2f} s, harness {wall:.2f} s", flush=True)
    p, h = statistics.median(plain), statistics.median(harness)
    print(f"median plain torchrun {p:.2f} s, under the harness {h:.2f} s, ratio {h / p:.3f}")
    print(f"median step time under the harness (rank 0): {statistics.median(steps) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
