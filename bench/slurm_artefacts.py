"""Real Slurm artefacts of real failures, for `incident import`'s fixtures.

    python bench/slurm_artefacts.py [--out tests/data/incidents/slurm_real]

Starts a Slurm cluster on this machine (3 nodes: one spare, as a site has; accounting on), runs
bench/targets/slurm_train.py as a lab runs it (srun starts the ranks), makes each
failure happen for real, and keeps what an engineer would be handed afterwards, in one
folder per case: the job's output file (`slurm-<id>.out`, or `slurm-<id>_<task>.out` for
an array task), `scontrol show job <id>` (`scontrol.txt`), `sacct -D -P`
(`sacct.txt`), and slurmctld's log lines about the job and its nodes (`slurmctld.log`).
Each case's `expected.json` says what happened, as tests/incident/test_corpus.py reads
it:

- `time_limit_hang`: rank 1 stopped (SIGSTOP) at step 8; rank 0 waits in its
  all_reduce (30 min timeout) until the 1-minute time limit ends the job;
- `node_failure`: node n2 (rank 1) fails at step 12, every process on it killed; Slurm
  requeues the job (`--requeue`, output appended), which resumes from its checkpoint on
  n1 and the spare n3;
- `preemption`: a job in the `urgent` partition takes all three nodes at step 12; the
  training job's step gets SIGTERM (5 s grace) and its ranks die of it; a job that ends
  within its grace time ends FAILED, and is not requeued;
- `time_limit_saved`: `--signal=USR1@40`; the job saves on the signal and requeues
  itself before its time limit;
- `array_task_hang`: task 1 of a 2-task array, its one rank stopped at step 8, ended by
  the time limit; and `array_task_out_of_time`: task 0 of the same array, still
  stepping when the same limit came (no hang: it ran out of time).

Three more as a new user's job leaves them (issue 61): torchrun run straight from the
batch script on one node (tests/scripts/stopping_trainer.py, whose rank 1 stops itself),
kept as the user has them: the job's output file and `scontrol show job` saved as
`job-<id>.txt`, no sacct and no slurmctld log.

- `user_stopped_rank_pyspy`: rank 1 stops after step 30; `py-spy dump` of both ranks
  (`stacks/rank<N>.txt`, stdout and stderr, as an engineer runs it: the stopped rank's
  dump fails) while rank 0 waits in its barrier-less all_reduce, then the time limit;
- `user_stopped_rank`: rank 1 stops after step 15, no dumps, no timestamps;
- `user_stopped_rank_timestamps`: the same with `logging`'s time on each line, a step
  every 0.5 s, then the silence until the time limit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from torchchaos.host import procs
from torchchaos.host.slurm import jobs
from torchchaos.host.slurm.cluster import Cluster

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "bench" / "targets" / "slurm_train.py"


def batch_script(work: Path, steps: int, extra: str = "", nodes: int = 2) -> Path:
    script = work / "train.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        export MASTER_ADDR=127.0.0.1   # the first node's address (one machine here)
        export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
        echo "job $SLURM_JOB_ID attempt ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST"
        # a preempted job that ends within its grace time is FAILED, not requeued: the
        # batch script outlives the SIGTERM and waits for the ranks
        trap 'echo "batch: SIGTERM, waiting for the ranks"' TERM
        srun -N{nodes} --ntasks-per-node=1 {sys.executable} {TRAIN} --steps {steps} \\
            --ckpt-dir {work}/ckpt-$SLURM_JOB_ID {extra} &
        wait $! || wait $!
        """))
    return script


def rank_pid(job: int, rank: int, array_task: str | None = None) -> int | None:
    for pid, values in procs.env_vars(("SLURM_JOB_ID", "SLURM_PROCID",
                                       "SLURM_ARRAY_TASK_ID")).items():
        if values.get("SLURM_PROCID") != str(rank):
            continue
        if array_task is not None and values.get("SLURM_ARRAY_TASK_ID") != array_task:
            continue
        if array_task is None and values.get("SLURM_JOB_ID") != str(job):
            continue
        try:  # the rank itself: not srun or the batch script, whose lines name it too
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if words[:2] == [sys.executable.encode(), str(TRAIN).encode()]:
            return pid
    return None


def wait_step(out: Path, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while f"step {step} loss" not in (out.read_text() if out.exists() else ""):
        if time.monotonic() > deadline:
            raise SystemExit(f"{out}: no step {step} within {timeout} s")
        time.sleep(0.2)


def keep(cluster: Cluster, job: int, out: Path, case: Path, what: dict) -> None:
    case.mkdir(parents=True, exist_ok=True)
    time.sleep(6)  # slurmctld hands the records to slurmdbd a few seconds after
    env = {**os.environ, **cluster.env()}
    shutil.copy(out, case / out.name)
    (case / "scontrol.txt").write_text(subprocess.run(
        ["scontrol", "show", "job", str(job)], capture_output=True, text=True, env=env).stdout)
    (case / "sacct.txt").write_text(subprocess.run(
        ["sacct", "-D", "-P", "-j", str(job), "-o",
         "JobID,JobName,Partition,State,ExitCode,NodeList,Start,End,Elapsed"],
        capture_output=True, text=True, env=env).stdout)
    lines = cluster.layout.log("slurmctld").read_text().splitlines()
    nodes = ("n1", "n2", "n3")
    mine = [line for line in lines if f"JobId={job}" in line or f"JobId={job}_" in line
            or f"job {job}" in line or any(f" {n} " in line or f"node {n}" in line
                                           or f"Nodes {n}" in line for n in nodes)]
    (case / "slurmctld.log").write_text("\n".join(mine) + "\n")
    expected = {"injected": what.pop("what"), "rank": None, "node": None,
                "phase": "unknown", "recovery": "not seen", **what}
    (case / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"{case.name}: job {job}, {len(mine)} slurmctld lines", flush=True)


def time_limit_hang(cluster: Cluster, work: Path, out_root: Path) -> None:
    out = work / "slurm-%j.out"
    job = jobs.submit(str(batch_script(work, 100000, "--step-sleep 0.2")),
                      ["--time=1", "-N2", f"-o{out}", "-Jtrain"], cluster.env())
    out = Path(str(out).replace("%j", str(job)))
    wait_step(out, 8)
    os.kill(rank_pid(job, 1), signal.SIGSTOP)
    jobs.wait_ended(job, 200, cluster.env())
    keep(cluster, job, out, out_root / "time_limit_hang",
         {"kind": "hang", "rank": 1, "phase": "between_saves",
          "what": "rank 1 stopped at step 8 (SIGSTOP); rank 0 waited in all_reduce"
                  " until the 1-minute time limit"})


def node_failure(cluster: Cluster, work: Path, out_root: Path) -> None:
    out = work / "slurm-%j.out"
    job = jobs.submit(str(batch_script(work, 30, "--step-sleep 0.2")),
                      ["-N2", "--requeue", "--open-mode=append", f"-o{out}", "-Jtrain"],
                      cluster.env())
    out = Path(str(out).replace("%j", str(job)))
    wait_step(out, 12)
    cluster.fail_node("n2")
    jobs.wait_for(job, lambda r: r.get("Restarts") == "1", 120, cluster.env(), "its requeue")
    jobs.release(job, 120, cluster.env())  # onto n1 and the spare n3
    jobs.wait_ended(job, 200, cluster.env())
    cluster.restart_node("n2")
    keep(cluster, job, out, out_root / "node_failure",
         {"kind": "node", "recovery": "resumed",
          "what": "node n2 (rank 1's) lost at step 12: slurmd, its steps and the rank"
                  " SIGKILLed; Slurm requeued the job, which resumed from step 10 on n1"
                  " and n3"})


def preemption(cluster: Cluster, work: Path, out_root: Path) -> None:
    out = work / "slurm-%j.out"
    job = jobs.submit(str(batch_script(work, 100, "--step-sleep 0.2")),
                      ["-N2", "--requeue", "--open-mode=append", f"-o{out}", "-Jtrain"],
                      cluster.env())
    out = Path(str(out).replace("%j", str(job)))
    wait_step(out, 12)
    urgent = jobs.submit("--wrap=sleep 3", ["-p", "urgent", "-N3", "--exclusive",
                                             f"-o{work}/urgent-%j.out"], cluster.env())
    jobs.wait_ended(urgent, 120, cluster.env())
    jobs.wait_ended(job, 200, cluster.env())
    keep(cluster, job, out, out_root / "preemption",
         {"kind": "preempt", "phase": "between_saves",
          "what": f"job {urgent} in partition urgent took all three nodes at step 12; the"
                  " training job's step got SIGTERM (5 s grace), its ranks died of it, and"
                  " the job ended FAILED: a job that ends within its grace time is not"
                  " requeued (Slurm 22.05)"})


def time_limit_saved(cluster: Cluster, work: Path, out_root: Path) -> None:
    out = work / "slurm-%j.out"
    job = jobs.submit(str(batch_script(work, 100000, "--step-sleep 0.2")),
                      ["--time=1", "--signal=USR1@40", "-N2", "--requeue",
                       "--open-mode=append", f"-o{out}", "-Jtrain"], cluster.env())
    out = Path(str(out).replace("%j", str(job)))
    jobs.wait_for(job, lambda r: r.get("Restarts") == "1", 200, cluster.env(), "its requeue")
    jobs.cancel(job, cluster.env())
    jobs.wait_ended(job, 60, cluster.env())
    keep(cluster, job, out, out_root / "time_limit_saved",
         {"kind": "preempt", "phase": "between_saves",
          "what": "USR1 40 s before the 1-minute limit; the job saved at the step it"
                  " got it and requeued itself (then cancelled, pending)"})


def array_task_hang(cluster: Cluster, work: Path, out_root: Path) -> None:
    out = work / "slurm-%A_%a.out"
    script = batch_script(work, 100000, "--step-sleep 0.2", nodes=1)
    job = jobs.submit(str(script), ["--time=1", "--array=0-1", "-N1", f"-o{out}",
                                    "-Jtrain"], cluster.env())
    task = Path(str(out).replace("%A", str(job)).replace("%a", "1"))
    wait_step(task, 8)
    os.kill(rank_pid(job, 0, array_task="1"), signal.SIGSTOP)
    jobs.wait_ended(job, 200, cluster.env())
    keep(cluster, job, task, out_root / "array_task_hang",
         {"kind": "hang", "rank": 0, "phase": "between_saves",
          "what": "array task 1's one rank stopped at step 8 (SIGSTOP), ended by the"
                  " time limit"})
    other = Path(str(out).replace("%A", str(job)).replace("%a", "0"))
    keep(cluster, job, other, out_root / "array_task_out_of_time",
         {"kind": "preempt", "phase": "between_saves",
          "what": "array task 0, still stepping when its 1-minute time limit came:"
                  " SIGTERM to its task, then SIGKILL; no hang"})


STOPPING = REPO / "tests" / "scripts" / "stopping_trainer.py"


def torchrun_script(work: Path, extra: str) -> Path:
    """A new user's batch script: torchrun on the one node, the script's output folder."""
    script = work / "user.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        cd {work}
        {Path(sys.executable).parent / "torchrun"} --standalone --nproc_per_node 2 \\
            {STOPPING} {work}/out-$SLURM_JOB_ID --steps 400 {extra}
        """))
    return script


def worker_pids(job: int) -> dict[int, int]:
    """{rank: pid} of the job's torchrun workers (they, not torchrun, have RANK set)."""
    found = {}
    for pid, values in procs.env_vars(("SLURM_JOB_ID", "RANK")).items():
        if values.get("SLURM_JOB_ID") == str(job) and values.get("RANK") is not None:
            found[int(values["RANK"])] = pid
    return found


def keep_as_a_user(cluster: Cluster, job: int, out: Path, case: Path, what: dict) -> None:
    case.mkdir(parents=True, exist_ok=True)
    shutil.copy(out, case / out.name)
    (case / f"job-{job}.txt").write_text(subprocess.run(
        ["scontrol", "show", "job", str(job)], capture_output=True, text=True,
        env={**os.environ, **cluster.env()}).stdout)
    expected = {"injected": what.pop("what"), "node": None, "recovery": "not seen", **what}
    (case / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"{case.name}: job {job}", flush=True)


def _user_stopped_rank(cluster: Cluster, work: Path, case: Path, stop_at: int, extra: str,
                       dumps: bool) -> None:
    out = work / "slurm-%j.out"
    job = jobs.submit(str(torchrun_script(work, f"--stop-rank 1 --stop-at {stop_at} {extra}")),
                      ["--time=1", "-N1", f"-o{out}", "-Jtrain"], cluster.env())
    out = Path(str(out).replace("%j", str(job)))
    wait_step(out, stop_at)
    time.sleep(3)  # rank 0 is in its next step's all_reduce, waiting for rank 1
    if dumps:
        (case / "stacks").mkdir(parents=True, exist_ok=True)
        for rank, pid in sorted(worker_pids(job).items()):
            dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True,
                                  text=True)
            (case / "stacks" / f"rank{rank}.txt").write_text(dump.stdout + dump.stderr)
    jobs.wait_ended(job, 200, cluster.env())
    keep_as_a_user(cluster, job, out, case,
                   {"kind": "hang", "rank": 1, "phase": "between_saves",
                    "script": str(STOPPING.relative_to(REPO)),
                    "what": f"rank 1 stopped itself (SIGSTOP) after step {stop_at}; rank 0"
                            " waited in its all_reduce (1 h timeout) until the 1-minute time"
                            " limit ended the job"})


def user_stopped_rank_pyspy(cluster: Cluster, work: Path, out_root: Path) -> None:
    _user_stopped_rank(cluster, work, out_root / "user_stopped_rank_pyspy", 30, "", True)


def user_stopped_rank(cluster: Cluster, work: Path, out_root: Path) -> None:
    _user_stopped_rank(cluster, work, out_root / "user_stopped_rank", 15, "", False)


def user_stopped_rank_timestamps(cluster: Cluster, work: Path, out_root: Path) -> None:
    _user_stopped_rank(cluster, work, out_root / "user_stopped_rank_timestamps", 15,
                       "--timestamps --step-sleep 0.5", False)


CASES = {"time_limit_hang": time_limit_hang, "node_failure": node_failure,
         "preemption": preemption, "time_limit_saved": time_limit_saved,
         "array_task_hang": array_task_hang, "user_stopped_rank_pyspy": user_stopped_rank_pyspy,
         "user_stopped_rank": user_stopped_rank,
         "user_stopped_rank_timestamps": user_stopped_rank_timestamps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=REPO / "tests" / "data" / "incidents" / "slurm_real")
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    ns = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slurm-artefacts-"))
    with Cluster.start(nodes=3, accounting_too=True) as cluster:
        for name in ns.case or CASES:
            CASES[name](cluster, work, ns.out)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
