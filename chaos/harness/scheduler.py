"""A multi-node run through Slurm: the job submitted, the scheduler's faults made, judged.

`torchchaos cluster run` runs a training job the way a lab's nightly does: one Slurm
batch job, one task per node (`srun --ntasks-per-node=1`), each task a `torchchaos
node` that launches that node's torchrun (c10d rendezvous on the job's first node,
`torchchaos.harness.multinode`), the histories in a shared directory. The recovery
judged is the scheduler's: the job is submitted with `--requeue`, the node harnesses
never relaunch anything themselves (`--max-relaunches 0`), and when Slurm runs the
job again (SLURM_RESTART_COUNT) each node goes on with the same run.

This harness stays outside the job, on the machine that submits it (a login node):

- first the fault-free job (run id `reference-<the job's hash>`), once per job and
  shared directory;
- then the job with faults. Agent faults fire inside its ranks as on one machine;
  a `slurm` fault (`torchchaos.faults.slurm`) is asked for by the rank that reaches
  its trigger and made here, through Slurm: a node's failure, a time limit with its
  warning signal, a preemption;
- a requeued job waits for its begin time (Slurm holds it until its last try's
  credentials expired: `AuthInfo=cred_expire` + 1 s, 121 s by default):
  `release_requeued` starts it at once, as tests want; `--keep-hold` leaves
  Slurm's hold as it is;
- once the job ended for good, `torchchaos gather` judges it against the reference
  (the same checks as everywhere), a job the scheduler ended without its nodes
  finishing counting as a job that did not complete.

A harness that dies while its job is queued or running has its job cancelled by its
lifeline (`torchchaos.host.cluster_folders.note_job`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torchchaos.errors import CannotJudge, UsageError
from torchchaos.faults.faultfs.client import request
from torchchaos.faults.faultfs.mount import Mount
from torchchaos.faults.slurm import JOB_MARK
from torchchaos.harness.multinode import REFERENCE_ID, finished_nodes, judge_nodes
from torchchaos.harness.runner import Progress
from torchchaos.host import cluster_folders as folders
from torchchaos.host import lifeline, netns
from torchchaos.host.slurm import jobs
from torchchaos.host.slurm.cluster import Cluster
from torchchaos.host.slurm.config import URGENT
from torchchaos.report.report_file import Report
from torchchaos.rundir.history import HistoryWriter
from torchchaos.rundir.layout import RunLayout
from torchchaos.scenario import schedule
from torchchaos.scenario.spec import parse_fault_spec

POLL_SECONDS = 0.5
DEADLINE_SLACK = 120.0  # beyond a try's --timeout: the node harnesses' own teardown
SETTLE_SECONDS = 3.0  # an ended state held this long is the end (a requeue follows within it)
# what only the local cluster lets the harness do, and why
LOCAL_ONLY = {
    ("event", "node_fail"): "kills a node's slurmd and processes",
    ("event", "preempt"): f"submits to a partition that preempts the job's ({URGENT})",
    ("power", "lost"): "mounts the fault filesystem over the run's folder on this machine",
}
JOB_FILE = "slurm-job.sh"  # the job script, in the run's _chaos/
STREAM = "harness-slurm.jsonl"  # what this harness did to the job, beside the nodes' streams

# One try of the job: Slurm runs this script again when it requeues the job. The
# rendezvous endpoint is the first node's address as slurmctld knows it.
JOB_SCRIPT = """#!/bin/bash
# torchchaos cluster run: one try of the job (a requeue runs it again)
set -u
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
address=$(scontrol show node "$first" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
port=${{TORCHCHAOS_RDZV_PORT:-$((29500 + SLURM_JOB_ID % 1000))}}
echo "torchchaos: job $SLURM_JOB_ID, restart ${{SLURM_RESTART_COUNT:-0}}, on $SLURM_JOB_NODELIST"
# each task: `torchchaos node` with its node rank, the script and its arguments after `--`
srun --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c 'endpoint=$1; shift; harness=()
    while [ "$1" != -- ]; do harness+=("$1"); shift; done
    exec "${{harness[@]}}" --node-rank "$SLURM_NODEID" --nnodes "$SLURM_NNODES" \\
        --rdzv-endpoint "$endpoint" "$@"' _ "${{address:-$first}}:$port" {node}
"""


@dataclass(frozen=True)
class SlurmRun:
    """One job on a Slurm cluster, its faults and where its runs go."""

    script: str
    args: list[str]
    shared: Path  # a directory every node sees at the same path
    nodes: int = 2
    nproc: int = 1
    faults: list[str] = field(default_factory=list)
    seed: int = 0
    timeout: float = 300.0  # each try of the job (`torchchaos node --timeout`)
    queue_wait: float = 600.0  # how long a job may wait for its nodes
    options: list[str] = field(default_factory=list)  # more sbatch options
    release_requeued: bool = True  # start a requeued job at once (Slurm holds it ~2 min)
    checks: list[str] | None = None

    def job_key(self) -> str:
        """The job, without its faults: the runs of one job share their reference."""
        key = json.dumps([str(Path(self.script).resolve()), self.args, self.nodes, self.nproc])
        return hashlib.sha256(key.encode()).hexdigest()[:8]

    def reference_dir(self) -> Path:
        return self.shared / f"{REFERENCE_ID}-{self.job_key()}"

    def storage_dir(self) -> Path:
        """Beside the run directory: the fault filesystems of its power losses."""
        return self.shared / f"{self.run_id()}.storage"

    def run_id(self) -> str:
        if not self.faults:
            return self.reference_dir().name
        key = json.dumps([self.faults, self.seed, self.job_key()])
        return "slurm-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def run(spec: SlurmRun, cluster: Cluster | None, environ: Mapping[str, str],
        progress: Progress) -> Report:
    """Run the fault-free job if the shared directory has none yet, then the job with
    `spec.faults`; the verdict of the latter (or of the reference when there are none).
    `cluster`: the local cluster the jobs run on, None for a site's (`environ` then
    names it, e.g. SLURM_CONF); node failures need the local one."""
    _check(spec, cluster)
    reference = spec.reference_dir()
    if not _all_done(reference) and (RunLayout(reference).chaos_dir / JOB_FILE).is_file():
        progress(f"the fault-free job in {reference} never finished: it runs again")
        shutil.rmtree(reference)  # a folder this harness made (its job script is in it)
    if not _all_done(reference):
        state = _run_job(replace(spec, faults=[]), cluster, environ, progress)
        if not _all_done(reference):
            raise CannotJudge(f"the target fails without faults: the fault-free job ended"
                              f" {state}, its nodes did not complete ({_last_words(reference)})")
    elif not spec.faults:
        progress(f"the fault-free job already ran in {reference}")
    if not spec.faults:
        return judge_nodes(reference, reference, spec.checks, 0.0, progress)
    ended = _run_job(spec, cluster, environ, progress)
    return judge_nodes(spec.shared / spec.run_id(), reference, spec.checks, SETTLE_SECONDS,
                  progress, ended_by=ended)


def _check(spec: SlurmRun, cluster: Cluster | None) -> None:
    """Bad input, before anything is queued."""
    if spec.nodes < 1 or spec.nproc < 1:
        raise UsageError("--nodes and --nproc must be at least 1")
    for text in spec.faults:
        fault = parse_fault_spec(text)
        for (key, value), why in LOCAL_ONLY.items():
            if cluster is None and fault.kind == "slurm" and fault.params.get(key) == value:
                raise UsageError(f"slurm {key}={value} {why}: only on a cluster torchchaos"
                                 " started (`torchchaos cluster up`)")
    if not Path(spec.script).is_file():
        raise UsageError(f"no training script {spec.script}")


def _all_done(run_dir: Path) -> bool:
    done = finished_nodes(run_dir)
    return bool(done) and len(done) >= max(d["nnodes"] for d in done.values()) and all(
        d.get("completed") for d in done.values())


def _last_words(run_dir: Path) -> str:
    """The job's output's last line, where it says why."""
    for out in sorted(RunLayout(run_dir).logs_dir.glob("slurm-*.out"), reverse=True):
        lines = [line.strip() for line in out.read_text(errors="replace").splitlines()
                 if line.strip()]
        if lines:
            return f"{out}: {lines[-1]}"
    return f"no output in {RunLayout(run_dir).logs_dir}"


def _node_command(spec: SlurmRun) -> list[str]:
    """`torchchaos node` as every task runs it, less its node rank and endpoint."""
    run_id = spec.run_id()
    command = [sys.executable, "-m", "torchchaos.cli", "node", "--shared", str(spec.shared),
               "--nproc", str(spec.nproc), "--run-id", run_id, "--timeout", f"{spec.timeout:g}",
               "--max-relaunches", "0", "--seed", str(spec.seed), "--quiet"]
    for fault in spec.faults:
        command += ["--fault", fault]
    if spec.faults:
        command += ["--reference", str(spec.reference_dir())]
    return [*command, "--", str(Path(spec.script).resolve()), *spec.args]


def _prepare(spec: SlurmRun, mark: str) -> tuple[Path, list[Mount]]:
    """The run directory, its job script and, for a fault whose power goes, the fault
    filesystem over the folders it drops unsynced data of. `mark`: the id the lifeline
    knows this harness's job and mounts by (registered before either exists)."""
    run_dir = spec.shared / spec.run_id()
    layout = RunLayout(run_dir)
    storage = spec.storage_dir()
    if run_dir.exists() or storage.exists():
        raise UsageError(f"{run_dir} exists: a run of these faults already ran there (remove"
                         " it, or change --seed)")
    lifeline.own(mark, run_dir)
    lifeline.own(mark, storage)
    layout.logs_dir.mkdir(parents=True)
    job_script = layout.chaos_dir / JOB_FILE
    job_script.write_text(JOB_SCRIPT.format(node=shlex.join(_node_command(spec))))
    mounts: list[Mount] = []
    try:
        for number, folder in enumerate(_power_lost_dirs(spec)):
            # beside the run directory, linked into it: every node harness reaps the
            # mounts under the run directory when its try ends, and this one must last
            # through the scheduler's tries
            mountpoint = storage / folder
            (run_dir / folder).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / folder).symlink_to(mountpoint, target_is_directory=True)
            state = layout.chaos_dir / "faultfs" / f"{number}-power"
            mounts.append(Mount(mountpoint, state,
                                layout.history_dir / f"faultfs-{number}-power.jsonl").start())
    except BaseException:
        for mount in mounts:
            mount.close()
        raise
    return job_script, mounts


def _power_lost_dirs(spec: SlurmRun) -> list[str]:
    found = [parse_fault_spec(text) for text in spec.faults]
    return sorted({str(f.params.get("dir", "ckpt")) for f in found
                   if f.kind == "slurm" and f.params.get("power") == "lost"})


def _submit(spec: SlurmRun, job_script: Path, cluster: Cluster | None,
            environ: Mapping[str, str], mark: str) -> int:
    """Queue the job, and note it for the lifeline (a harness that dies cancels it)."""
    layout = RunLayout(job_script.parent.parent)
    # the port: where the nodes share this machine, one free here; on a site, from the id
    port = {"TORCHCHAOS_RDZV_PORT": str(netns.free_port())} if cluster is not None else {}
    options = ["-N", str(spec.nodes), "--ntasks-per-node=1", "--requeue", "--open-mode=append",
               f"--output={layout.logs_dir}/slurm-%j.out", f"--job-name=torchchaos-{spec.run_id()}",
               f"--export=ALL,{JOB_MARK}=1" + "".join(f",{k}={v}" for k, v in port.items()),
               *spec.options]
    job = jobs.submit(str(job_script), options, environ)
    folders.note_job(mark, job, environ.get("SLURM_CONF", ""))
    return job


def _run_job(spec: SlurmRun, cluster: Cluster | None, environ: Mapping[str, str],
             progress: Progress) -> str:
    """Submit the job, make its faults, release its requeues; its final state."""
    mark = uuid.uuid4().hex[:12]
    job_script, mounts = _prepare(spec, mark)
    run_dir = spec.shared / spec.run_id()
    try:
        job = _submit(spec, job_script, cluster, environ, mark)
    except BaseException:  # refused, or slurmctld did not answer: nothing ran
        for mount in mounts:
            mount.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(spec.storage_dir(), ignore_errors=True)
        raise
    what = "the fault-free job" if not spec.faults else f"the job with {', '.join(spec.faults)}"
    progress(f"{what}: Slurm job {job}, run {run_dir}")
    scheduler = SchedulerNemesis(job, run_dir, cluster, environ, progress, mounts)
    try:
        return _follow(spec, job, scheduler, environ, progress)
    finally:
        jobs.cancel(job, environ)  # a no-op once it ended; else nothing is left queued
        scheduler.close()
        folders.job_file(mark).unlink(missing_ok=True)


def _follow(spec: SlurmRun, job: int, scheduler: SchedulerNemesis,
            environ: Mapping[str, str], progress: Progress) -> str:
    started = time.monotonic()
    restarts = 0
    ended_since: float | None = None
    running = False
    while True:
        record = jobs.show(job, environ)
        state = record.get("JobState", "")
        now = time.monotonic()
        if state == "RUNNING" and not running:
            running, started = True, now
        if not running and now - started > spec.queue_wait:
            raise CannotJudge(f"Slurm job {job} did not start within {spec.queue_wait:g} s"
                              f" ({state or 'no record'}: {record.get('Reason', '')})")
        if running and now - started > spec.timeout + DEADLINE_SLACK:  # a try's deadline
            raise CannotJudge(f"Slurm job {job} ran past its deadline ({spec.timeout:g} s a"
                              " try, which its nodes should have kept): cancelled")
        scheduler.poll(record)
        if int(record.get("Restarts", "0")) > restarts:
            restarts = int(record["Restarts"])
            progress(f"Slurm requeued job {job} (restart {restarts})")
            if scheduler.power_goes:  # once every process of the try is gone
                jobs.wait_for(job, lambda r: r.get("JobState") == "PENDING", 60.0, environ,
                              "PENDING after its requeue")
                scheduler.between_tries()
            if spec.release_requeued:
                jobs.release(job, 60.0, environ)
            running, started, ended_since = False, time.monotonic(), None
            continue
        if state in jobs.ENDED:
            ended_since = ended_since or now
            if now - ended_since >= SETTLE_SECONDS:
                progress(f"Slurm job {job} ended {state} after {restarts} requeue(s)")
                scheduler.ended(state, restarts)
                return state
        else:
            ended_since = None
        time.sleep(POLL_SECONDS)


class SchedulerNemesis:
    """Makes the `slurm` faults the job's ranks ask for (`torchchaos.faults.slurm`),
    and heals what it broke (a failed node's slurmd) once the job is over."""

    def __init__(self, job: int, run_dir: Path, cluster: Cluster | None,
                 environ: Mapping[str, str], progress: Progress,
                 mounts: list[Mount] | None = None) -> None:
        self.job = job
        self.mounts = {m.mountpoint: m for m in mounts or []}
        self.power_goes: list[Any] = []  # time limits whose power goes once the try ended
        self.run_dir = run_dir
        self.cluster = cluster
        self.environ = environ
        self.progress = progress
        self.layout = RunLayout(run_dir)
        self.done: set[str] = set()
        self.failed_nodes: list[str] = []
        self.urgent: list[int] = []  # the jobs a preemption submitted
        self.preempting: tuple[Any, int, int] | None = None  # (fault, restarts, urgent job)
        self.limit_at: float | None = None  # when the time limit ends the job
        self.limit_restarts = 0
        self.limit_ended = False  # the time limit ended the job (no requeue follows)
        self.log = HistoryWriter(self.layout.history_dir / STREAM, source="harness")

    def poll(self, record: dict[str, str]) -> None:
        for fault in self._requested():
            self._make(fault, record)
            self.done.add(fault.id)
            (self.layout.requests_dir / f"{fault.id}.done").touch()
        if self.preempting is not None and _preempted(record, self.preempting[1]):
            fault, _, urgent = self.preempting
            self.preempting = None
            self._acted(fault, {"urgent_job": urgent},
                        f"job {urgent} of partition {URGENT} took the job's nodes")
        if self.limit_at is not None and time.monotonic() >= self.limit_at:
            self.limit_at = None
            if record.get("JobState") == "RUNNING" and \
                    int(record.get("Restarts", "0")) == self.limit_restarts:
                jobs.cancel(self.job, self.environ)  # SIGTERM, KillWait, SIGKILL: the limit
                self.limit_ended = True
                self.progress(f"Slurm job {self.job}: its time limit ended it")

    def _requested(self) -> list[Any]:
        requests = self.layout.requests_dir
        if not requests.is_dir() or not self.layout.schedule_file.exists():
            return []
        asked = {p.stem for p in requests.glob("*.json")} - self.done
        return [f for f in schedule.load(self.layout.schedule_file)
                if f.id in asked and f.kind == "slurm"]

    def _asked_at(self, fault: Any) -> int | None:
        try:
            asked = json.loads((self.layout.requests_dir / f"{fault.id}.json").read_text())
        except (OSError, ValueError):
            return None
        return asked.get("step")

    def _make(self, fault: Any, record: dict[str, str]) -> None:
        try:
            getattr(self, f"_{fault.params['event']}")(fault, record)
        except (UsageError, CannotJudge) as exc:
            self.log.record("fault_error", id=fault.id, error=str(exc))

    def _acted(self, fault: Any, details: dict[str, Any], said: str) -> None:
        """The fault took effect: the event that makes it count as fired (at the step its
        rank asked at)."""
        self.log.record("slurm_fault", id=fault.id, event=fault.params["event"], said=said,
                        step=self._asked_at(fault), **details)
        self.progress(f"Slurm job {self.job}: {fault.spec}: {said}")

    def _node_fail(self, fault: Any, record: dict[str, str]) -> None:
        assert self.cluster is not None  # refused before the job was queued
        names = _hostnames(record.get("NodeList", ""), self.environ)
        if fault.index >= len(names):
            raise UsageError(f"the job runs on {len(names)} node(s), no node {fault.index}")
        node = names[fault.index]
        lost = ""
        if fault.params.get("power") == "lost":  # its processes die in the power loss
            dropped = self._power_loss(fault, self.cluster.node_pids(node))
            lost = f"; the power loss dropped {dropped}"
        killed = self.cluster.fail_node(node)
        self.failed_nodes.append(node)
        self._acted(fault, {"node": node, "killed": len(killed)},
                    f"node {node} failed: its slurmd and its processes killed{lost}")

    def _power_loss(self, fault: Any, pids: list[int] | None, at_firing: bool = True) -> str:
        """What the machines had not made durable under the fault's folder is gone (and
        `pids` die first); in words, what went. `at_firing`: the loss is the fault's
        firing (a node failure); else it comes later, and the checks date it by its own
        event (a time limit's power loss once the try ended)."""
        # resolved: the link in the run directory leads to the mountpoint
        mount = self.mounts[(self.run_dir / str(fault.params.get("dir", "ckpt"))).resolve()]
        reply = request(mount.socket_path, {"cmd": "crash", "lose_unsynced": True,
                                            "pids": pids,
                                            "fault_id": fault.id if at_firing else ""})
        gone = [*reply.get("removed", []), *reply.get("reverted_files", [])]
        return f"{len(gone)} unsynced entr(ies)" if gone else "nothing"

    def between_tries(self) -> None:
        """The job's try ended and Slurm will run it again: a time limit's power loss
        happens now (the maintenance the limit made room for)."""
        for fault in self.power_goes:
            dropped = self._power_loss(fault, None, at_firing=False)
            self.log.record("slurm_power_loss", id=fault.id, dropped=dropped)
            self.progress(f"Slurm job {self.job}: the nodes lost power; it dropped {dropped}")
        self.power_goes = []

    def _time_limit(self, fault: Any, record: dict[str, str]) -> None:
        signal = str(fault.params.get("signal", "USR1"))
        lead = float(fault.params.get("lead", 10.0))  # type: ignore[arg-type]
        jobs.cancel(self.job, self.environ, signal=signal, steps_only=True)
        self.limit_at = time.monotonic() + lead
        self.limit_restarts = int(record.get("Restarts", "0"))
        if fault.params.get("power") == "lost":
            self.power_goes.append(fault)
        self._acted(fault, {"signal": signal, "lead": lead},
                    f"SIG{signal} to every task, {lead:g} s before the limit")

    def _preempt(self, fault: Any, record: dict[str, str]) -> None:
        nodes = record.get("NodeList", "")
        count = len(_hostnames(nodes, self.environ))
        urgent = jobs.submit_command(["sleep", "5"], [
            "-p", URGENT, "-w", nodes, "-N", str(count), "--exclusive",  # it needs them whole
            "--job-name=torchchaos-urgent", f"--output={self.layout.logs_dir}/urgent-%j.out"],
            self.environ)
        self.urgent.append(urgent)
        self.preempting = (fault, int(record.get("Restarts", "0")), urgent)

    def ended(self, state: str, restarts: int) -> None:
        """The job is over: how, for the checks (a job the scheduler ended is no job
        that failed on its own)."""
        if state == "COMPLETED":
            return
        why = ("its time limit ended it (SIGTERM, KillWait, SIGKILL), and Slurm requeues no"
               " job that ran out of time" if self.limit_ended else f"it ended {state}")
        self.log.record("scheduler_end", state=state, restarts=restarts,
                        said=f"Slurm job {self.job}: {why}")

    def close(self) -> None:
        """Bring back the nodes a node failure took, once the job is over (a node brought
        back while the job still runs takes its requeue and hangs it: Slurm 22.05)."""
        if self.preempting is not None:
            self.log.record("fault_error", id=self.preempting[0].id,
                            error="the job ended before the scheduler preempted it")
        for urgent in self.urgent:
            jobs.cancel(urgent, self.environ)
        for node in self.failed_nodes:
            if self.cluster is not None:
                self.cluster.restart_node(node)
        self.failed_nodes = []
        for mount in self.mounts.values():
            mount.close()
        self.log.close()


def _preempted(record: dict[str, str], restarts: int) -> bool:
    return int(record.get("Restarts", "0")) > restarts or record.get("JobState") in (
        "PREEMPTED", "REQUEUED")


def _hostnames(nodelist: str, environ: Mapping[str, str]) -> list[str]:
    if not nodelist or nodelist == "(null)":
        return []
    return jobs.hostnames(nodelist, environ)

