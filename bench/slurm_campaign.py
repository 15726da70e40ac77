"""A bit-flip campaign over a Slurm job array against the same campaign on one machine.

    python bench/slurm_campaign.py [--runs 8] [--tasks 2] [--nodes 2]

Side by side in one run on this machine, with the reference run made first and cached
for both (as a nightly's shared cache holds it after its first night):

1. a local Slurm cluster (`torchchaos.host.slurm`, N nodes), the nightly recipe as
   cron starts it (deploy/slurm/submit.sh: an array of A campaign shards, then the
   merge after `afterany`), timed from the submission until the merge job ended;
2. `torchchaos campaign --runs R` on this machine, one process, timed from outside.

Prints both times, their ratio, the Slurm jobs' states and exit codes, and whether the
merged campaign.json equals the one machine's (every run's fault, seed and outcome).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchchaos.host.slurm import jobs
from torchchaos.host.slurm.cluster import Cluster

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=2)
    ns = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slurm-bench-"))
    cache = work / "runs" / "cache"
    cache.mkdir(parents=True)
    cli = [sys.executable, "-m", "torchchaos.cli"]
    subprocess.run([*cli, "campaign", "--quiet", "--runs", "1", "--cache-dir", str(cache),
                    "--out", str(work / "warm")], check=True, capture_output=True)
    venv = work / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    settings = work / "nightly.env"
    settings.write_text("\n".join([
        f'TORCHCHAOS_VENV="{venv.parent}"', f'RUNS_ROOT="{work / "runs"}"', 'PARTITION=""',
        f"TASKS={ns.tasks}", f"RUNS={ns.runs}", "CPUS_PER_TASK=1", "MEM=1G",
        "TIME=01:00:00", "MERGE_TIME=00:10:00", 'FAIL_ON="silent divergence,hang"',
        "CAMPAIGN_ARGS=()"]) + "\n")
    with Cluster.start(nodes=ns.nodes) as cluster:
        start = time.monotonic()
        said = subprocess.run([str(REPO / "deploy/slurm/submit.sh")], capture_output=True,
                              text=True, check=True, env={
                                  "HOME": str(work), "PATH": "/usr/bin:/bin",
                                  "TORCHCHAOS_SETTINGS": str(settings), **cluster.env()})
        array, merge = map(int, re.findall(r"job (\d+)", said.stdout))
        jobs.wait_ended(merge, 3600, cluster.env(), poll=1)
        array_wall = time.monotonic() - start
        tasks = jobs.states(array, cluster.env())
        merged = jobs.show(merge, cluster.env())
    start = time.monotonic()
    subprocess.run([*cli, "campaign", "--quiet", "--runs", str(ns.runs), "--cache-dir",
                    str(cache), "--out", str(work / "whole")], capture_output=True,
                   env={**os.environ})
    whole_wall = time.monotonic() - start
    same = json.loads((work / "runs" / f"campaign-{array}" / "merged" / "campaign.json")
                      .read_text()) == json.loads((work / "whole" / "campaign.json").read_text())
    print(f"{ns.runs} runs, {ns.tasks} array tasks on {ns.nodes} nodes (2 cores in all)")
    print(f"  Slurm array + merge: {array_wall:.1f} s (tasks {', '.join(tasks)};"
          f" merge {merged['JobState']}, exit {merged['ExitCode']})")
    print(f"  one machine:         {whole_wall:.1f} s")
    print(f"  ratio:               {array_wall / whole_wall:.2f}x")
    print(f"  merged campaign.json equals one machine's: {same}")
    print(f"  (work folder: {work})")


if __name__ == "__main__":
    main()
