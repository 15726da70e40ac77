"""What do container nodes cost next to namespace nodes, run for run?

The same chaos run on two simulated nodes (one gloo rank each), once on namespace
nodes (`--network netns`) and once on container nodes (`--network docker`: an engine
of the run's own, one container per node, a killed node replaced), alternating, each
`--repeats` times, after one run of each that fills the reference cache. For each: the
verdict and the run's wall time as the harness measured it (`Report.wall_seconds`:
from the first launch to the last process reaped, the engine's start and stop
included), and the whole `run_scenario` call's.

    python bench/container_nodes.py [--repeats 5]

Needs root, Debian's docker.io and debootstrap (the base is made once and cached).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from torchchaos.engine import run_scenario
from torchchaos.scenario.model import Scenario

TARGET = Path(__file__).resolve().parent.parent / "targets" / "ddp_lm.py"
ARGS = ["--steps", "12", "--ckpt-every", "4"]
FAULTS = {"kill": "kill:node=1,step=6", "partition": "partition:node=1,step=6,for=4"}


def once(network: str, fault: str, folder: Path) -> tuple[str, float, float]:
    args = [*ARGS, "--timeout", "3"] if fault.startswith("partition") else ARGS
    scenario = Scenario.build(str(TARGET), args=args, nproc=1, nodes=2, network=network,
                              faults=[fault])
    started = time.monotonic()
    report = run_scenario(scenario, folder, folder.parent / "cache")
    return report.verdict.upper(), report.wall_seconds, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    print("| fault | nodes | verdicts | run (harness), median s | whole call, median s |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, fault in FAULTS.items():
            seen: dict[str, list[tuple[str, float, float]]] = {"netns": [], "docker": []}
            for network in seen:  # the reference of each, cached
                once(network, fault, Path(tmp) / f"warm-{name}-{network}")
            for k in range(repeats):
                for network in seen:
                    seen[network].append(once(network, fault, Path(tmp) / f"{name}-{network}-{k}"))
            for network, runs in seen.items():
                verdicts = " ".join(sorted({v for v, _, _ in runs}))
                print(f"| {fault} | {network} | {verdicts} ({len(runs)}) |"
                      f" {statistics.median(w for _, w, _ in runs):.2f} |"
                      f" {statistics.median(c for _, _, c in runs):.2f} |")


if __name__ == "__main__":
    main()
