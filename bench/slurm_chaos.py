"""Chaos under the scheduler: what `torchchaos cluster run` costs beside a plain Slurm job.

    python bench/slurm_chaos.py [--steps 300]

Side by side in one run, on a local Slurm cluster of three nodes
(`torchchaos.host.slurm`), the bundled target on two nodes, one rank each:

1. the plain job a lab submits: one batch job, `srun` one torchrun per node, c10d
   rendezvous on the first node; timed from sbatch until Slurm says it ended;
2. the same job through `torchchaos cluster run` without faults (its fault-free
   reference: every rank's agent, two node harnesses, the verdict);
3. `cluster run` with each scheduler fault at step 12: a node failure, a preemption,
   a time limit (lead 3 s), each a Slurm requeue (the time limit ends the bundled target,
   which has no handler for the warning).

Prints each row's wall time from the harness's start to its verdict, the ratio of row 2
to row 1, and each verdict. The requeued rows wait for Slurm to notice a dead node
(SlurmdTimeout 5 s here, 300 s on a site's default) and for the requeue's hold, which
the harness releases 2 s after the requeue.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchchaos.host import netns
from torchchaos.host.slurm import jobs
from torchchaos.host.slurm.cluster import Cluster

REPO = Path(__file__).resolve().parent.parent
PLAIN = """#!/bin/bash
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --ntasks-per-node=1 bash -c 'exec {python} -m torch.distributed.run --nnodes 2 \\
    --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} \\
    --rdzv-id plain "$@"' _ {target} --steps {steps} --ckpt-every 5
"""
FAULTS = ["slurm:event=node_fail,node=1,step=12", "slurm:event=preempt,step=12",
          "slurm:event=time_limit,step=12,lead=3"]


def _plain(cluster: Cluster, work: Path, steps: int) -> tuple[float, str]:
    script = work / "plain.sh"
    script.write_text(PLAIN.format(python=sys.executable, port=netns.free_port(),
                                   target=REPO / "targets" / "ddp_lm.py", steps=steps))
    (work / "plain").mkdir()
    start = time.monotonic()
    job = jobs.submit(str(script), ["-N2", "--ntasks-per-node=1", f"--chdir={work / 'plain'}",
                                    f"--output={work}/plain-%j.out"], cluster.env())
    states = jobs.wait_ended(job, 600, cluster.env(), poll=0.2)
    return time.monotonic() - start, ",".join(states)


def _cluster_run(cluster: Cluster, shared: Path, fault: str | None,
                 steps: int) -> tuple[float, str]:
    command = [sys.executable, "-m", "torchchaos.cli", "cluster", "run", "--quiet", "--dir",
               str(cluster.layout.root), "--shared", str(shared),
               *([f"--fault={fault}"] if fault else []), "--",
               str(REPO / "targets" / "ddp_lm.py"), "--steps", str(steps), "--ckpt-every", "5"]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - start
    verdict = next((line.split()[1] for line in done.stdout.splitlines()
                    if line.startswith("verdict:")), f"exit {done.returncode}")
    failing = [line.split()[0] for line in done.stdout.splitlines()
               if len(line.split()) > 1 and line.split()[1] == "FAIL"
               and not line.startswith("verdict:")]
    return seconds, verdict + (f" ({', '.join(failing)})" if failing else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    ns = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slurm-chaos-bench-"))
    rows = []
    with Cluster.start(nodes=3) as cluster:
        plain, state = _plain(cluster, work, ns.steps)
        rows.append(("plain sbatch + srun + torchrun", "none", plain, state))
        shared = work / "shared"
        shared.mkdir()
        reference, verdict = _cluster_run(cluster, shared, None, ns.steps)
        rows.append(("torchchaos cluster run", "none (its reference)", reference, verdict))
        for fault in FAULTS:
            seconds, verdict = _cluster_run(cluster, shared, fault, ns.steps)
            rows.append(("torchchaos cluster run", fault, seconds, verdict))
    for job, fault, seconds, verdict in rows:
        print(f"{job:32} {fault:40} {seconds:7.1f} s  {verdict}")
    print(f"ratio, fault-free cluster run / plain job: {reference / plain:.2f}x")
    print(json.dumps({"steps": ns.steps, "rows": [
        {"job": j, "fault": f, "seconds": round(s, 1), "verdict": v} for j, f, s, v in rows]}))


if __name__ == "__main__":
    main()
