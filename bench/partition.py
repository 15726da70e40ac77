"""What do simulated nodes cost, and how fast does a job come back after a partition?

1. Overhead: the same fault-free two-node job (one gloo rank per node, the
   bundled reference target) run alternately with `--network host` (both
   agents on the machine's loopback) and `--network netns` (each node in its
   own namespace on a bridge): wall time of each job, including setting up
   and removing the namespaces.
2. Recovery: node 1 isolated after step 10 for `--cut` seconds (target
   collective timeout 3 s): from the cut to the first rank exiting (the job
   noticed), from the heal to the first step after it (back to work), and
   the whole run against the fault-free one.

    python bench/partition.py [--repeat 3] [--cut 6]

Needs root (namespaces). Times come from the runs' histories (one monotonic
clock for every process).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from torchchaos.engine import run_scenario
from torchchaos.harness.runner import Job
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario

TARGET = Path(__file__).resolve().parent.parent / "targets" / "ddp_lm.py"
ARGS = ["--steps", "30", "--ckpt-every", "5", "--timeout", "3"]


def job_seconds(network: str, folder: Path) -> float:
    scenario = Scenario.build(str(TARGET), args=ARGS, nproc=1, nodes=2, network=network)
    folder.mkdir()
    start = time.monotonic()
    outcome = Job(scenario, folder, []).run()
    assert outcome.completed, f"the {network} job did not complete: {outcome.log_tail()}"
    return time.monotonic() - start


def recovery(cut: float, folder: Path) -> dict[str, float]:
    scenario = Scenario.build(str(TARGET), args=ARGS, nproc=1, nodes=2, network="netns",
                              faults=[f"partition:node=1,step=10,for={cut:g}"])
    report = run_scenario(scenario, folder, folder.parent / "cache")
    assert report.verdict == "pass", report.table()
    history = History.of_run(Path(report.run_dir))
    began = history.of("nemesis_begin")[0]["t"]
    healed = history.of("nemesis_end")[0]["t"]
    noticed = min(e["t"] for e in history.of("rank_exit") if e["t"] > began)
    back = min(e["t"] for e in history.steps() if e["t"] > healed)
    return {"noticed": noticed - began, "back_after_heal": back - healed,
            "wall": report.wall_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cut", type=float, default=6.0)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchchaos-bench-") as tmp:
        base = Path(tmp)
        times: dict[str, list[float]] = {"host": [], "netns": []}
        for i in range(ns.repeat):
            for network in ("host", "netns"):  # alternate: drift hits both alike
                times[network].append(job_seconds(network, base / f"{network}-{i}"))
        host, inside = statistics.median(times["host"]), statistics.median(times["netns"])
        print(f"fault-free 2-node job, {ns.repeat} runs each (median):")
        print(f"  host network  {host:6.2f} s   {times['host']}")
        print(f"  namespaces    {inside:6.2f} s   {times['netns']}")
        print(f"  ratio netns/host {inside / host:.2f}")
        rows = [recovery(ns.cut, base / f"cut-{i}") for i in range(ns.repeat)]
        print(f"\nnode 1 isolated after step 10 for {ns.cut:g} s (target timeout 3 s):")
        for key in ("noticed", "back_after_heal", "wall"):
            values = [round(r[key], 2) for r in rows]
            print(f"  {key:16s} median {statistics.median(values):6.2f} s   {values}")


if __name__ == "__main__":
    main()
