"""slurm: the scheduler's own failures, made through Slurm itself, on a job it runs.

A training job on a cluster goes through what its scheduler does to it, and a lab's
resume path is mostly the scheduler's: its requeue, its signals, its limits. These
faults act on the Slurm job that `torchchaos cluster run` submitted
(`torchchaos.harness.scheduler`); the rank that reaches the trigger asks for the
fault as for any harness fault, and the job's harness outside the job makes it:

- `event=node_fail`: node `node=K` of the job's allocation (in Slurm's host-name
  order) dies: its slurmd and every process of the job on it are SIGKILLed and the
  node stops answering; slurmctld marks it DOWN, the job NODE_FAIL, and a job
  submitted with `--requeue` (the harness does) runs again on the nodes left. Only
  on a cluster the harness started (`torchchaos cluster up`): it cannot kill a
  site's nodes.
- `event=time_limit`: the job's time limit comes due. First the warning a job
  asks for with `--signal=USR1@LEAD` (`signal=`, default USR1; `lead=` seconds,
  default 10), delivered by slurmstepd to every process of the job's steps; `lead`
  seconds later, unless the job requeued itself by then (`scontrol requeue`, the lab
  habit), the job is ended as its limit ends it (SIGTERM, KillWait, SIGKILL; Slurm
  does not requeue a job that ran out of time). slurmctld enforces a limit only in
  whole minutes, checked every 30 s, so the harness ends the job itself with
  `scancel` at the moment the limit would: its state says CANCELLED, not TIMEOUT.
- `event=preempt`: a job of the cluster's higher-priority partition (`urgent`)
  takes the job's nodes; Slurm sends SIGTERM, waits KillWait, then SIGKILL, and
  requeues the job.

`power=lost` (node_fail, time_limit): the machines lose power too, so what the job
had not made durable under `dir=` (default `ckpt`, in the run directory) is gone:
the harness mounts the fault filesystem there (`torchchaos.faults.storage`'s
model). With a node failure the node's processes die in the power loss; after a time
limit the power goes once the job's try has ended (the site's maintenance that the
time limit made room for), before Slurm runs it again. A kill keeps the page cache
and so hides a missing fsync; this does not.
"""

from __future__ import annotations

import os

from torchchaos.errors import UsageError
from torchchaos.faults.contract import HarnessKind
from torchchaos.faults.params import choice, run_relative_dir, seconds
from torchchaos.faults.storage import Storage

EVENTS = ("node_fail", "time_limit", "preempt")
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")
POWER = ("kept", "lost")
JOB_MARK = "TORCHCHAOS_SLURM_HARNESS"  # set in the jobs `torchchaos cluster run` submits



class Slurm(HarnessKind):
    name = "slurm"
    side = "scheduler"  # made by the harness outside the Slurm job, not by a runner's nemesis
    summary = ("the scheduler's failures on a Slurm job: a node's failure (requeue), its time"
               " limit with a signal ahead, a preemption with grace time")
    not_on_a_cluster = "a Slurm scheduler's own failure; Kubernetes has no Slurm job"
    params = {"event": choice(EVENTS), "lead": seconds, "signal": choice(SIGNALS),
              "power": choice(POWER), "dir": run_relative_dir}
    choices = {"event": EVENTS, "signal": SIGNALS, "power": POWER}
    # fired once Slurm acted, not when the rank asked: a preemption whose job ended
    # before the scheduler took its nodes tested nothing
    effect_event = "slurm_fault"
    marks = ("slurm_fault",)

    def said(self, event: dict[str, object]) -> str:
        return str(event.get("said", ""))

    def validate(self, params: dict[str, object]) -> None:
        event = params.get("event")
        if event is None:
            raise UsageError(f"slurm needs event= (one of {', '.join(EVENTS)})")
        if event != "time_limit" and ("lead" in params or "signal" in params):
            raise UsageError("slurm: lead= and signal= belong to event=time_limit")
        if event == "preempt" and ("power" in params or "dir" in params):
            raise UsageError("slurm: power= and dir= belong to event=node_fail or time_limit")
        if "dir" in params and params.get("power") != "lost":
            raise UsageError("slurm: dir= is where power=lost drops what was not durable")

    def check_job(self, params: dict[str, object], nodes: int, network: str) -> None:
        if params.get("power") == "lost":
            reason = Storage.unavailable_reason()
            if reason:
                raise UsageError(f"slurm power=lost needs the fault filesystem: {reason}")
        if JOB_MARK not in os.environ:
            raise UsageError("slurm faults act on a Slurm job: run them with `torchchaos"
                             " cluster run` (it submits the job and makes the fault)")
