"""Several machines: one harness per machine, one shared directory, one verdict.

`torchchaos node` runs on every machine of a real multi-node job. It launches
that machine's torchrun (c10d rendezvous at a HOST:PORT every machine
reaches) with the agent in every worker, as on one machine, and requeues its
torchrun when it dies, the way a cluster scheduler restarts a pod. Node
faults fire in the agent of the node they target (`kill:node=K` kills the
torchrun and workers of the machine whose torchrun the rendezvous gave group
rank K), so the harnesses share nothing but the directory. `torchchaos
gather` waits for every node's done marker, merges what the nodes wrote into
one History and judges it against a fault-free run made the same way.

A shared directory (NFS, Lustre: the same path on every machine):

    SHARED/reference/          the fault-free run (the run id when no --fault is given)
    SHARED/RUN_ID/             a run directory: {run_dir}, every worker's cwd
      _chaos/schedule.json                 the resolved schedule (each node resolves it)
      _chaos/history/rank-R.jsonl          each global rank's events, as on one machine
      _chaos/history/harness-node-K.jsonl  node K's launches, exits and worker pids
      _chaos/logs/launch-L-node-K.log      node K's torchrun output, launch L
      _chaos/nodes/node-K.json             node K is done: its outcome and its clock
      report.json, report.html             written by gather

Clocks. Events carry `time.monotonic()`, a clock per machine. Nodes that share
a boot (one machine) share it; otherwise gather moves every event onto node
0's clock by each node's wall-minus-monotonic offset (NTP keeps wall clocks
within milliseconds), attributing a worker's events to the machine whose
harness saw its pid.

Attempts. Each torchrun numbers its own restarts and each harness its own
relaunches: after node 1 alone was requeued, its workers are (launch 1,
attempt 0) and node 0's (launch 0, attempt 1), yet both belong to the job's
second rendezvous round. A round starts one process per global rank, so
gather renumbers: a rank's i-th process belongs to round i (`attempt` i; the
node's own numbers stay in `node_launch` / `node_attempt`).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchchaos.errors import CannotJudge, UsageError
from torchchaos.faults.contract import FaultKind
from torchchaos.faults.registry import get_kind
from torchchaos.harness.hangwatch import default_timeout
from torchchaos.harness.runner import (
    POLL_SECONDS,
    Job,
    JobOutcome,
    Progress,
    job_environment,
    torchrun_command,
)
from torchchaos.host import procs
from torchchaos.judge import checks_by_name as check_registry
from torchchaos.judge import interval
from torchchaos.judge.evidence import Evidence
from torchchaos.report.report_file import Report
from torchchaos.report.verdict import judge, write_html
from torchchaos.rundir.history import Event, History, HistoryWriter, read_stream
from torchchaos.rundir.layout import RunLayout
from torchchaos.scenario import schedule
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.schedule import ResolvedFault

REFERENCE_ID = "reference"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class NodeSpec:
    """Which part of which job this machine runs."""

    shared: Path
    run_id: str
    node_rank: int
    nnodes: int
    endpoint: str  # HOST:PORT of the rendezvous store (node 0's torchrun hosts it)
    local_addr: str | None = None  # this machine's address as its peers reach it
    rdzv_conf: str = ""  # more torchrun --rdzv-conf settings, KEY=VALUE,...

    @property
    def run_dir(self) -> Path:
        return self.shared / self.run_id


def marker_file(run_dir: Path, node: int) -> Path:
    """Node `node`'s done marker: its outcome, written once its part of the job ended."""
    return RunLayout(run_dir).chaos_dir / "nodes" / f"node-{node}.json"


def harness_stream(run_dir: Path, node: int) -> Path:
    return RunLayout(run_dir).history_dir / f"harness-node-{node}.jsonl"


def parse_endpoint(text: str) -> str:
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--rdzv-endpoint must be HOST:PORT, got {text!r}")
    return text


def default_run_id(faults: list[str], seed: int) -> str:
    """What every node calls the run when not told: the same faults and seed give the
    same id on every machine without a word between them."""
    if not faults:
        return REFERENCE_ID
    return "chaos-" + hashlib.sha256(json.dumps([faults, seed]).encode()).hexdigest()[:8]


def check_kinds(scenario: Scenario) -> None:
    """Only faults the agent fires inside a rank, and the scheduler's (made from outside
    the job by `torchchaos cluster run`): partitions and mounts need a harness acting on
    every machine at once."""
    for spec in scenario.faults:
        kind = get_kind(spec.kind)
        if kind.side == "scheduler":
            continue
        if kind.side != "agent" or type(kind).setup_job is not FaultKind.setup_job:
            raise UsageError(f"{spec.kind} faults are not supported across machines (the"
                             " harness would have to act on every machine at once); use the"
                             " cluster's own tooling (Chaos Mesh) for them")


def finished_nodes(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The done markers found so far, by node."""
    found = {}
    for path in (RunLayout(run_dir).chaos_dir / "nodes").glob("node-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found[data["node"]] = data
    return found


def _all_done(run_dir: Path) -> bool:
    done = finished_nodes(run_dir)
    return bool(done) and len(done) >= max(d["nnodes"] for d in done.values())


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: gather may read it from another machine at any moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temp, path)


def _clock() -> dict[str, Any]:
    boot = BOOT_ID.read_text().strip() if BOOT_ID.exists() else socket.gethostname()
    return {"host": socket.gethostname(), "boot_id": boot, "offset": time.time() - time.monotonic()}


class NodeJob(Job):
    """This machine's part of the job: one torchrun, requeued when it dies.

    No hang detector: it reads every rank's heartbeat and would take the stacks of
    pids that live on other machines; the deadline bounds a hung node.
    """

    SERVED = False  # its torchrun is started as the machine's user would start it

    def __init__(self, scenario: Scenario, spec: NodeSpec, faults: list[ResolvedFault],
                 reference: Path | None, progress: Progress) -> None:
        super().__init__(scenario, spec.run_dir, faults, reference, progress)
        self.spec = spec
        # the process marker: this harness's own. The run id is the same on every node
        # and for every run of the same faults, so where two nodes or two runs share a
        # machine (tests, or two jobs on one host) each reaps only its own processes: a
        # node interrupted on this machine killed another run's node 0 with the same id
        self.run_id = f"{spec.run_id}-node-{spec.node_rank}-{uuid.uuid4().hex[:8]}"
        self.launch = 0
        self.seen: set[int] = set()

    def command(self) -> list[str]:
        cmd = torchrun_command(self.scenario, self.spec.node_rank, self.spec.run_id, 0,
                               self.layout.run_dir, endpoint=self.spec.endpoint,
                               warm=self.warm)
        if self.spec.local_addr:  # a torchrun option: after `python -m torch.distributed.run`
            cmd[3:3] = ["--local-addr", self.spec.local_addr]
        if self.spec.rdzv_conf:  # after the is_host setting torchrun_command made
            at = cmd.index("--rdzv-conf") + 1
            cmd[at] += "," + self.spec.rdzv_conf
        return cmd

    def _harness_log(self) -> HistoryWriter:
        return HistoryWriter(harness_stream(self.spec.run_dir, self.spec.node_rank),
                             source="harness", node=self.spec.node_rank)

    def _start(self, launch: int, t0: float) -> None:
        self.launch = launch
        environ = job_environment(self.scenario, self.layout.run_dir, self.run_id, launch, t0,
                                  self.reference)
        log_path = self.layout.logs_dir / f"launch-{launch}-node-{self.spec.node_rank}.log"
        with open(log_path, "ab") as log_file:
            self.nodes = [subprocess.Popen(
                self.command(), cwd=self.layout.run_dir, env=environ, stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)]

    def _wait(self, deadline: float, log: HistoryWriter) -> tuple[list[int | None], str]:
        torchrun = self.nodes[0]
        while True:
            code = torchrun.poll()
            self._note_workers(log)
            if code is not None:
                return [code], "exited"
            if time.monotonic() > deadline:
                return [code], "deadline"
            time.sleep(POLL_SECONDS)

    def _note_workers(self, log: HistoryWriter) -> None:
        """Record new worker pids: gather tells by them which machine (and clock) a
        rank's events came from, since a global rank can move between machines."""
        torchrun = self.nodes[0].pid
        new = set(procs.tree([torchrun])) - {torchrun} - self.seen
        if new:
            self.seen |= new
            log.record("workers", launch=self.launch, pids=sorted(new))


def _node_reference(spec: NodeSpec, given: Path | None, faulty: bool) -> Path | None:
    """The fault-free run the agent looks restored states up in (runs with faults)."""
    if given is None and not faulty:
        return None
    reference = (given or spec.shared / REFERENCE_ID).resolve()
    if not _all_done(reference):
        raise UsageError(f"no finished fault-free run in {reference}: run the same commands"
                         f" without --fault first (run id '{REFERENCE_ID}'), or pass --reference")
    return reference


def _agree_on_schedule(faults: list[ResolvedFault], path: Path) -> None:
    """Each node resolves the seeded schedule itself; one that comes to another one (other
    --fault or --seed than its peers) would fire faults the others do not expect."""
    if path.exists() and schedule.load(path) != faults:
        raise UsageError(f"{path} holds another schedule: every node needs the same --fault"
                         " and --seed")


def run_node(scenario: Scenario, spec: NodeSpec, reference: Path | None,
             progress: Progress) -> dict[str, Any]:
    """Run this machine's part of the job; returns what its done marker says."""
    check_kinds(scenario)  # first: a partition's own check would ask for simulated nodes
    scenario.validate()
    if not 0 <= spec.node_rank < spec.nnodes:
        raise UsageError(f"--node-rank must be between 0 and {spec.nnodes - 1}")
    marker = marker_file(spec.run_dir, spec.node_rank)
    restart = scheduler_restarts()
    earlier = _earlier_tries(spec, restart)
    faults = schedule.resolve(scenario.faults, scenario.seed, scenario.nproc, scenario.nodes)
    reference = _node_reference(spec, reference, bool(faults))
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    _agree_on_schedule(faults, RunLayout(spec.run_dir).schedule_file)
    job = NodeJob(scenario, spec, faults, reference, progress)
    job.first_launch = len(list(RunLayout(spec.run_dir).logs_dir.glob(
        f"launch-*-node-{spec.node_rank}.log")))
    record: dict[str, Any] = {"node": spec.node_rank, "nnodes": spec.nnodes,
                              "run_id": spec.run_id, "clock": _clock(), "command": job.command(),
                              "reference": str(reference or ""), "interrupted": True,
                              "restart": restart, "tries": earlier}
    again = f", the scheduler's restart {restart}" if restart else ""
    progress(f"node {spec.node_rank} of {spec.nnodes}: run {spec.run_dir}{again},"
             f" {len(faults)} fault(s): {', '.join(f.spec for f in faults) or 'none'}")
    started = time.monotonic()
    try:
        with _warnings_passed_on():
            outcome = job.run()
        record.update(interrupted=False, completed=outcome.completed,
                      deadline_hit=outcome.deadline_hit,
                      exit_codes=[c for t in earlier for c in t["exit_codes"]]
                      + outcome.exit_codes,
                      wall_seconds=outcome.wall_seconds, reaped=outcome.reaped,
                      leftovers=outcome.leftovers)
        return record
    finally:  # also on Ctrl-C: gather then says the node never finished its part
        # (and a scheduler's later try counts this one's time)
        record.setdefault("wall_seconds", time.monotonic() - started)
        _write_json(marker, record)


def scheduler_restarts() -> int:
    """How often the scheduler requeued the job this node runs in (Slurm's
    SLURM_RESTART_COUNT; 0 outside a scheduler)."""
    text = os.environ.get("SLURM_RESTART_COUNT", "0")
    return int(text) if text.isdigit() else 0


def _earlier_tries(spec: NodeSpec, restart: int) -> list[dict[str, Any]]:
    """What this node did in the scheduler's earlier tries of the same job: a requeued
    job runs the same command again, and the run goes on where they left it. A node
    that already ran outside such a requeue is a run id used twice."""
    marker = marker_file(spec.run_dir, spec.node_rank)
    if not marker.exists():
        return []
    try:
        last = json.loads(marker.read_text())
    except (OSError, ValueError):
        last = {}
    if restart <= int(last.get("restart", 0)):
        raise UsageError(f"node {spec.node_rank} already ran in {spec.run_dir}; choose a new"
                         " --run-id")
    tries = last.pop("tries", [])
    last.setdefault("exit_codes", [[None]])  # killed before its torchrun ended: no code
    return [*tries, last]


class _warnings_passed_on:
    """Keep this harness and its torchrun alive through the warning signal a scheduler
    sends every process of a job ahead of its time limit (`--signal=USR1@120`): slurmstepd
    signals the whole step, workers included, and neither Python nor torchrun handles
    SIGUSR1 or SIGUSR2, so either would die of it and take the node with it. Ignored
    here, the signal stays ignored in the workers (an ignored signal survives exec) until
    the training script installs its own handler, as a script that wants it does."""

    SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)

    def __enter__(self) -> None:
        main = threading.current_thread() is threading.main_thread()  # tests run nodes in threads
        self.before = [signal.signal(s, signal.SIG_IGN) for s in self.SIGNALS] if main else []

    def __exit__(self, *exc: object) -> None:
        for sig, handler in zip(self.SIGNALS, self.before):
            signal.signal(sig, handler)


# -- gather ------------------------------------------------------------------

def wait_for_nodes(run_dir: Path, wait: float, progress: Progress) -> list[dict[str, Any]]:
    """Every node's done marker, waiting up to `wait` seconds for the missing ones."""
    deadline = time.monotonic() + wait
    said = False
    while True:
        done = finished_nodes(run_dir)
        expected = max((d["nnodes"] for d in done.values()), default=None)
        if expected is not None and len(done) >= expected:
            return [done[k] for k in sorted(done)]
        if time.monotonic() > deadline:
            missing = ("no node" if expected is None else "node(s) " + ", ".join(
                str(k) for k in range(expected) if k not in done))
            raise CannotJudge(f"{run_dir}: {missing} did not finish within {wait:g} s")
        if not said:
            progress(f"waiting up to {wait:g} s for every node of {run_dir} to finish")
            said = True
        time.sleep(0.5)


def _clock_shifts(nodes: list[dict[str, Any]]) -> dict[int, float]:
    """Seconds to add to each node's monotonic stamps to put them on node 0's clock."""
    base = nodes[0]["clock"]
    return {n["node"]: 0.0 if n["clock"]["boot_id"] == base["boot_id"]
            else n["clock"]["offset"] - base["offset"] for n in nodes}


def number_rounds(events: list[Event]) -> None:
    """Renumber the workers' (launch, attempt) by the job's rendezvous round, in place
    (see the module's docstring); `events` in time order."""
    processes: dict[int, list[tuple[int, int, int]]] = {}  # rank -> processes, oldest first
    for e in events:
        if "rank" in e and "pid" in e and "attempt" in e:
            key = (e["pid"], e["launch"], e["attempt"])
            keys = processes.setdefault(e["rank"], [])
            if key not in keys:
                keys.append(key)
    round_of = {(rank, key): i for rank, keys in processes.items() for i, key in enumerate(keys)}
    launch_of: dict[int, int] = {}  # the highest relaunch among a round's processes
    for (_, key), i in round_of.items():
        launch_of[i] = max(launch_of.get(i, 0), key[1])
    for e in events:
        i = round_of.get((e.get("rank"), (e.get("pid"), e.get("launch"), e.get("attempt"))))
        if i is not None:
            e["node_launch"], e["node_attempt"] = e["launch"], e["attempt"]
            e["launch"], e["attempt"] = launch_of[i], i


def merged_history(run_dir: Path, nodes: list[dict[str, Any]]) -> History:
    """Every node's harness stream and every rank's stream as one History on node 0's
    clock, with attempts numbered by rendezvous round."""
    shifts = _clock_shifts(nodes)
    machine_of: dict[tuple[int, int], int] = {}  # (pid, node's launch) -> node
    events: list[Event] = []
    harness = {harness_stream(run_dir, n["node"]): n["node"] for n in nodes}
    for path, node in harness.items():
        for e in read_stream(path) if path.exists() else []:
            if e["ev"] == "workers":
                machine_of.update({(pid, e["launch"]): node for pid in e["pids"]})
            events.append({**e, "t": e["t"] + shifts[node]})
    for path in sorted(RunLayout(run_dir).history_dir.glob("*.jsonl")):
        if path not in harness:
            for e in read_stream(path):
                node = machine_of.get((e.get("pid", -1), e.get("launch", -1)), 0)
                events.append({**e, "t": e["t"] + shifts.get(node, 0.0)})
    events.sort(key=lambda e: e["t"])
    number_rounds(events)
    return History(events)


def _exit_codes(nodes: list[dict[str, Any]]) -> list[list[int | None]]:
    """Per launch, every node's exit code; a node that needed fewer launches shows its
    last code, so the last row is how each node ended."""
    per_node = [[codes[0] for codes in n["exit_codes"]] or [None] for n in nodes]
    rows = max(len(codes) for codes in per_node)
    return [[codes[min(i, len(codes) - 1)] for codes in per_node] for i in range(rows)]


def _check_finished(nodes: list[dict[str, Any]], run_dir: Path, what: str) -> None:
    broken = [str(n["node"]) for n in nodes if n["interrupted"]]
    if broken:
        raise CannotJudge(f"{what} {run_dir}: node(s) {', '.join(broken)} were interrupted"
                          " or failed in the harness before their part of the job ended")


def _ended_by_scheduler(node: dict[str, Any], state: str) -> dict[str, Any]:
    """A node's record as the scheduler left it: one its job ended mid-way (a time
    limit, a cancel, a node failure not requeued) did not complete."""
    tries = node.get("tries", [])
    wall = sum(t.get("wall_seconds", 0.0) for t in tries)
    if not node["interrupted"]:
        return {**node, "wall_seconds": node["wall_seconds"] + wall}
    return {**node, "interrupted": False, "completed": False, "deadline_hit": False,
            "exit_codes": [c for t in tries for c in t["exit_codes"]] + [[None]],
            "wall_seconds": wall + node.get("wall_seconds", 0.0), "reaped": [],
            "leftovers": [], "ended_by": state}


def _reference_nodes(reference: Path, wait: float,
                     progress: Progress) -> list[dict[str, Any]]:
    if not reference.is_dir():
        raise UsageError(f"no fault-free run in {reference}: run the job once without --fault"
                         f" (run id '{REFERENCE_ID}'), or pass --reference")
    nodes = wait_for_nodes(reference, wait, progress)
    _check_finished(nodes, reference, "the fault-free run")
    if schedule.load(RunLayout(reference).schedule_file):
        raise UsageError(f"{reference} is a run with faults, not a fault-free reference")
    if not all(n["completed"] for n in nodes):
        raise CannotJudge(f"the target fails without faults: the fault-free run {reference}"
                          f" ended with exit codes {_exit_codes(nodes)[-1]}")
    return nodes


def _run_dir(run_dir: Path) -> Path:
    run_dir = run_dir.resolve()
    if not run_dir.is_dir():
        raise UsageError(f"no run directory {run_dir}")
    chaos_dir = RunLayout(run_dir).chaos_dir
    if not chaos_dir.is_dir():  # the shared directory itself, likely
        runs = sorted(p.parent.name for p in run_dir.glob(f"*/{chaos_dir.name}"))
        raise UsageError(f"{run_dir} is not a run directory of torchchaos node"
                         + (f"; its runs: {', '.join(runs)}" if runs else ""))
    return run_dir


def _evidence(run_dir: Path, nodes: list[dict[str, Any]], reference: Path,
              ref_nodes: list[dict[str, Any]], max_lost_steps: int | None) -> Evidence:
    reference_history = merged_history(reference, ref_nodes)
    return Evidence(
        chaos=merged_history(run_dir, nodes), reference=reference_history,
        completed=all(n["completed"] for n in nodes),
        deadline_hit=any(n["deadline_hit"] for n in nodes), exit_codes=_exit_codes(nodes),
        wall_seconds=max(n["wall_seconds"] for n in nodes),
        reference_wall_seconds=max(n["wall_seconds"] for n in ref_nodes),
        leftovers=[p for n in nodes for p in n["leftovers"]],
        reaped=[p for n in nodes for p in n["reaped"]],
        log_tail=JobOutcome(run_dir).log_tail(), last_error=JobOutcome(run_dir).last_error(),
        max_lost_steps=max_lost_steps,
        chaos_dir=run_dir, reference_dir=reference,
        # no harness hang detector here: the bound a target's own reaction is held to
        hang_timeout=default_timeout(reference_history),
    )


def judge_nodes(run_dir: Path, reference: Path | None, checks: list[str] | None, wait: float,
           progress: Progress, max_lost_steps: int | None = None,
           ended_by: str | None = None) -> Report:
    """Judge a finished multi-node run; writes report.json and report.html into it.
    `ended_by`: the final state of the scheduler's job the run was (Slurm's JobState):
    a node it ended before its part did is a node that did not complete, not a harness
    that failed."""
    check_registry.validate(checks or [])
    run_dir = _run_dir(run_dir)
    nodes = wait_for_nodes(run_dir, wait, progress)
    if ended_by is None:
        _check_finished(nodes, run_dir, "run")
    else:
        nodes = [_ended_by_scheduler(n, ended_by) for n in nodes]
    # the one the nodes looked restored states up in, else the shared directory's
    used = nodes[0].get("reference")
    reference = (reference or (Path(used) if used else run_dir.parent / REFERENCE_ID)).resolve()
    ref_nodes = _reference_nodes(reference, wait, progress)
    if reference == run_dir:
        progress("judging the fault-free run against itself: it completes and leaves nothing")
    evidence = _evidence(run_dir, nodes, reference, ref_nodes, max_lost_steps)
    report = judge(evidence, schedule.load(RunLayout(run_dir).schedule_file), checks,
                   run_dir=str(run_dir), reference_dir=str(reference),
                   wall_seconds=evidence.wall_seconds, command=nodes[0]["command"],
                   checkpoint=interval.advice(evidence))
    report.write(run_dir)
    write_html(report, run_dir, evidence, progress)
    return report
