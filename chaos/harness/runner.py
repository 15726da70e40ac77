"""Launch one job (reference or chaos) under torchrun and always clean up.

A job is one torchrun agent per simulated node, each started in its own
session (and, on a `netns` network, in its node's network namespace), with a
deadline; harness faults (partitions) are applied and healed by the job's
`Nemesis` while the runner waits. If the whole job dies (every torchrun exits, some
non-zero), the runner relaunches it the way a cluster scheduler requeues a
job, up to `max_relaunches`, so recovery from checkpoints is exercised for
node loss too. Whatever happens — success, failure, deadline, Ctrl-C — the
`finally` reaps every process of the run, found by tree and by marker, heals
every fault and removes the namespaces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchchaos import env
from torchchaos.faults.contract import JobContext, JobResource
from torchchaos.faults.registry import get_kind
from torchchaos.harness import errorlines, spare
from torchchaos.harness.gate import Gate, GateError
from torchchaos.harness.hangwatch import STATE_ORDER, HangFinding, HangWatch
from torchchaos.harness.nemesis import Nemesis
from torchchaos.harness.repeats import RepeatWatch
from torchchaos.host import lifeline, netns, procs, seen_at, shortcuts, stacks
from torchchaos.host.busy import RunCpu
from torchchaos.host.mounts import mounts_under
from torchchaos.host.netns import Network
from torchchaos.progress import Progress
from torchchaos.rundir.history import History, HistoryWriter
from torchchaos.rundir.layout import RunLayout
from torchchaos.scenario import schedule
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.schedule import ResolvedFault

INJECT_DIR = Path(__file__).resolve().parents[1] / "rank" / "_inject"  # sitecustomize
POLL_SECONDS = 0.1
STORE_PORT = 29400  # the rendezvous store's port on node 0 (torchrun's usual one)
# Set to stop every Job of this process that is waiting (runs on threads of a parallel
# sweep, which a Ctrl-C in the main thread does not reach): each raises
# KeyboardInterrupt in its own thread, so its `finally` heals and reaps as usual.
_CANCELLED = threading.Event()



def cancel_all() -> None:
    _CANCELLED.set()


def reset_cancel() -> None:
    _CANCELLED.clear()


@dataclass
class GaveUp:
    """The runner stops the job: waiting longer cannot change how it ends."""

    reason: str


@dataclass
class JobOutcome:
    run_dir: Path
    completed: bool = False  # the last launch exited 0 on every node (or stopped as asked)
    stopped: bool = False  # every rank stopped as asked (Scenario.stop_after); then reaped
    deadline_hit: bool = False
    hang: dict[str, Any] | None = None  # the hang detector's finding (then torn down)
    # every rank ended its training, then the exit hung (torn down; the job completed)
    exit_hang: dict[str, Any] | None = None
    exit_codes: list[list[int | None]] = field(default_factory=list)  # per launch, per node
    gave_up: str = ""  # why the runner stopped the job early (torchchaos.harness.repeats)
    wall_seconds: float = 0.0
    reaped: list[int] = field(default_factory=list)  # killed by the harness after the job ended
    leftovers: list[int] = field(default_factory=list)  # alive even after reaping: a harness bug
    leftover_mounts: list[str] = field(default_factory=list)  # mounted after teardown: a bug
    leftover_network: list[str] = field(default_factory=list)  # namespaces, links: a bug

    @property
    def launches(self) -> int:
        return len(self.exit_codes)

    def log_tail(self) -> str:
        """The first error line of the last launch (the root cause; peers fail after it),
        else its last line: the one-line reason shown to the user."""
        lines, causes = self._last_launch_errors()
        return _shorten(causes[0] if causes else (lines or [""])[-1], 300)

    def last_log(self) -> Path | None:
        """The log of the last launch: where a user reads the script's whole output."""
        logs = sorted(RunLayout(self.run_dir).logs_dir.glob("launch-*.log"),
                      key=lambda p: p.stat().st_mtime)
        return logs[-1] if logs else None

    def last_error(self) -> str:
        """The last error line of the last launch: how its last attempt died (a resume
        that failed after a fault in an earlier attempt of the same launch)."""
        _lines, causes = self._last_launch_errors()
        return _shorten(causes[-1], 300) if causes else ""

    def _last_launch_errors(self) -> tuple[list[str], list[str]]:
        log = self.last_log()
        if log is None:
            return [], []
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()
                 if ln.strip()]
        # a peer's lost connection is the echo of a death, not its cause; with ranks
        # printing at once it can come first
        return lines, errorlines.causes(lines)


def _shorten(line: str, limit: int) -> str:
    """At most `limit` characters, cut between words (a cut word reads as a typo)."""
    if len(line) <= limit:
        return line
    cut = line[:limit - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut[limit // 2:] else cut) + "…"


HASH_SEED = "0"  # every job's PYTHONHASHSEED, unless the user set one (job_environment)


def substitute(args: list[str], run_dir: Path) -> list[str]:
    return [a.replace("{run_dir}", str(run_dir)) for a in args]


def torchrun_command(scenario: Scenario, node: int, run_id: str, port: int,
                     run_dir: Path, network: Network | None = None,
                     proxied: str | None = None, endpoint: str | None = None,
                     warm: bool = False) -> list[str]:
    """One node's torchrun. Node 0's agent hosts the c10d rendezvous store; on a
    simulated network each node runs inside its namespace and the store is at node 0's
    address; `proxied` is where nodes 1.. reach the store instead (a Toxiproxy);
    `endpoint` is where every node reaches it on a real network (HOST:PORT). `warm`:
    torchrun forks the ranks from a launcher with torch imported (`torchchaos.rank.warmrun`)."""
    launcher = "torchchaos.rank.warmrun" if warm else "torch.distributed.run"
    cmd = [sys.executable, "-m", launcher,
           "--nproc-per-node", str(scenario.nproc),
           "--max-restarts", str(scenario.max_restarts),
           "--monitor-interval", str(POLL_SECONDS)]
    size = f"{scenario.min_nodes}:{scenario.nodes}" if scenario.min_nodes else str(scenario.nodes)
    if scenario.nodes == 1 and not scenario.min_nodes:
        cmd += ["--standalone"]
        if network is not None:  # one node of its own (a container: its disk too)
            cmd = [*network.nodes[0].job_prefix(), *cmd]
    elif network is None:
        endpoint = endpoint or (proxied if proxied and node > 0 else f"127.0.0.1:{port}")
        cmd += ["--nnodes", size, "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                "--rdzv-id", run_id, "--rdzv-conf", f"is_host={int(node == 0)}"]
    else:
        me = network.nodes[node]
        cmd = [*me.job_prefix(), *cmd, "--nnodes", size, "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"{network.nodes[0].address}:{port}", "--rdzv-id", run_id,
               # the store's host is told, not guessed from host names (all nodes share one)
               "--rdzv-conf", f"is_host={int(node == 0)}",
               # the address the workers' own store and gloo use, not the machine's name
               "--local-addr", me.address]
    script = str(Path(scenario.script).resolve())
    return cmd + [script, *substitute(scenario.args, run_dir)]


def job_environment(scenario: Scenario, run_dir: Path, run_id: str, launch: int,
                    t0: float, reference: Path | None,
                    extra: dict[str, str] | None = None,
                    seen_at: Path | None = None) -> dict[str, str]:
    """The job's environment. `seen_at`: where the job sees its run directory
    (`torchchaos.host.seen_at`); its temporary folder stays under the real one."""
    environ = launcher_environment(scenario.env, extra)
    environ.update({env.RUN_DIR: str(seen_at or run_dir), env.RUN_ID: run_id,
                    env.LAUNCH: str(launch),
                    env.T0: repr(t0), **lifeline.lock_env()})
    if scenario.links:
        environ[env.LINKED] = json.dumps(sorted(Path(link).name for link in scenario.links))
    # torchrun and torch make temporary folders (torchelastic_*); keep them in the run,
    # under a name short enough for the sockets made there (host.shortcuts)
    environ["TMPDIR"] = str(shortcuts.short_tmp(RunLayout(run_dir).tmp_dir, run_id))
    if reference is not None:
        environ[env.REFERENCE] = str(reference)
        if scenario.stop_after:
            environ[env.STOP_AFTER] = str(scenario.stop_after)
        if scenario.full_fingerprints:
            environ[env.FULL_FINGERPRINTS] = "1"
    return environ


def launcher_environment(scenario_env: dict[str, str] | None = None,
                         extra: dict[str, str] | None = None) -> dict[str, str]:
    """What a job's environment holds besides its run's own marks: the same for every run
    of a scenario, and what its launcher imports with (`torchchaos.harness.spare`)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCHCHAOS_")}
    environ.update(scenario_env or {})
    environ.update(extra or {})
    path = [str(INJECT_DIR), *env.import_path(), environ.get("PYTHONPATH", "")]
    environ["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    environ.setdefault("OMP_NUM_THREADS", "1")
    # torchrun's c10d rendezvous shares its TCPStore with the workers by default, and
    # workers of an elastic restart then read the previous attempt's peer addresses
    # (pytorch/pytorch#135712, still seen on 2.13): every in-place restart fails to
    # connect. A job may set it back to "0" through Scenario.env to test that path.
    environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    environ.setdefault("PYTHONUNBUFFERED", "1")
    # One str-hash seed for every job, the reference's included: a warm job's ranks and
    # restarts share their launcher's seed, and a cold one's then agree with them. The
    # reference's second run (doctor) draws another (reference.OTHER_HASH_SEED).
    environ.setdefault("PYTHONHASHSEED", HASH_SEED)
    return environ


class Job:
    """One run of the scenario's job in `run_dir` (which the caller created)."""

    SERVED = True  # its launchers may be forked from a launcher server (harness.spare)

    def __init__(self, scenario: Scenario, run_dir: Path, faults: list[ResolvedFault],
                 reference: Path | None = None, progress: Progress | None = None,
                 hang_timeout: float = 60.0, start_from: Path | None = None,
                 record: str | None = None, gate: Gate | None = None,
                 warm: bool | None = None, seen_at: Path | None = None) -> None:
        self.scenario = scenario
        self.layout = RunLayout(run_dir)
        self.hangs = HangWatch(self.layout.beats_dir, hang_timeout)
        self.faults = faults
        self.reference = reference
        self.progress = progress or (lambda _msg: None)
        self.run_id = uuid.uuid4().hex[:12]
        self.nodes: list[subprocess.Popen[bytes] | spare.ServedLauncher] = []
        self.resources: list[JobResource] = []
        self.network: Network | None = None
        # one port for every launch's store (a proxy in front of it stays valid);
        # namespaces keep ports apart, so a fixed one there
        self.store_port = (STORE_PORT if scenario.network_kind in netns.NODE_NETWORKS
                           else netns.free_port())
        self.nemesis: Nemesis | None = None
        self.start_from = start_from  # copied into the run dir first (Scenario.start_from)
        self.record = record  # a folder the fault filesystem records (explore.crashstates)
        # held before its script starts until the caller says what the recorded folder
        # holds (a crash state's recovery, started warm: harness.gate)
        self.gate = gate
        if gate is not None and (record is None or faults):
            raise GateError("a job held at a gate records one folder and takes no faults")
        # ranks forked from a launcher with torch imported (torchchaos.rank.warmrun), and
        # so is every restart: unless the user asked for exec'd ranks (env.COLD_START)
        self.warm = (not env.cold_start()) if warm is None else warm
        # where the job sees its run directory: the folder a recording ran in, for a
        # recovery from a checkpoint that names it (torchchaos.host.seen_at)
        self.seen_at = seen_at
        if seen_at is not None and scenario.network_kind in netns.NODE_NETWORKS:
            raise ValueError("a job seen at another path runs on the host's network")
        self._recording: Any = None  # the recording's mounts (storage.FaultFSMounts)
        self._final_step: int | None = None  # the reference's, read once it is asked for
        # the number of this run's first launch: a job a scheduler requeued goes on
        # counting from its earlier tries' launches (harness.multinode)
        self.first_launch = 0

    def run(self) -> JobOutcome:
        lifeline.own(self.run_id, self.layout.run_dir)  # before anything of the run exists
        self.layout.create()
        schedule.save(self.faults, self.layout.schedule_file)
        outcome = JobOutcome(self.layout.run_dir)
        log = self._harness_log()
        if self.SERVED and self.warm and self.scenario.network_kind not in netns.NODE_NETWORKS \
                and self.seen_at is None:
            spare.prepare(job_environment(self.scenario, self.layout.run_dir, self.run_id, 0,
                                          0.0, self.reference))  # before the job's clock
        t0 = time.monotonic()
        deadline = t0 + self.scenario.timeout
        # a job held at a gate is a crash state's recovery: its first attempt resumes
        self.repeats = RepeatWatch(self.layout.run_dir, resumes_at_start=self.gate is not None)
        self._starting = RunCpu(self.run_id)  # a slow restart is busy, a stalled one idle
        try:
            if self.start_from is not None:  # before a mount moves it into its backing store
                shutil.copytree(self.start_from, self.layout.run_dir, symlinks=True,
                                dirs_exist_ok=True)
            self.layout.link(self.scenario.links)
            if self.scenario.network_kind == "netns":
                self.network = Network(self.run_id, self.scenario.nodes).create()
            elif self.scenario.network_kind == "docker":
                self.network = self._container_nodes()
            self._set_up_faults(log)
            if self.gate is not None:
                if not self._through_gate():
                    return outcome  # cancelled before its script started (reaped below)
                t0 = time.monotonic()  # the recovery starts now: the wait is none of it
                deadline = t0 + self.scenario.timeout
            last = self.first_launch + self.scenario.max_relaunches
            for launch in range(self.first_launch, last + 1):
                for resource in self.resources:
                    resource.settle()
                if launch > self.first_launch:
                    self._replace_dead_machines(outcome.exit_codes[-1])
                if launch > self.first_launch or self.gate is None:  # a held one runs already
                    self._start(launch, t0)
                self.hangs.launch_began()
                log.record("launch", launch=launch, pids=[p.pid for p in self.nodes],
                           warm=self.warm)
                codes, ended = self._wait(deadline, log)
                if isinstance(ended, HangFinding):
                    found = self._capture_hang(ended, log)
                    if ended.at_exit:
                        outcome.exit_hang = found
                    else:
                        outcome.hang = found
                    codes = [p.poll() for p in self.nodes]
                if isinstance(ended, GaveUp):
                    outcome.gave_up = ended.reason
                    log.record("gave_up", reason=ended.reason)
                    self.progress(ended.reason)
                outcome.exit_codes.append(codes)
                log.record("job_exit", launch=launch, codes=codes, stopped=ended == "stopped")
                if ended == "stopped":
                    outcome.completed = outcome.stopped = True
                    break
                if ended == "deadline":
                    outcome.deadline_hit = True
                    log.record("deadline", seconds=self.scenario.timeout)
                    break
                if outcome.exit_hang is not None:  # the work was done: killed, not failed
                    outcome.completed = True
                    break
                if outcome.hang is not None or outcome.gave_up:
                    break  # torn down below: a hung job, or one certain to die, is not requeued
                if all(code == 0 for code in codes):
                    outcome.completed = True
                    break
                self.progress(f"job died (exit codes {codes}); requeueing"
                              if launch < last else
                              f"job died (exit codes {codes}); no relaunch left")
                self._reap(log)
        finally:
            killed = self._reap(log)
            if outcome.completed and not outcome.stopped:  # ended, yet these still ran
                # (the ranks hung at exit and their torchrun agents are said as such)
                excused = {r["pid"] for r in (outcome.exit_hang or {}).get("ranks", [])}
                if outcome.exit_hang is not None:
                    excused |= {p.pid for p in self.nodes}
                outcome.reaped = [pid for pid in killed if pid not in excused]
            outcome.leftovers = procs.marked_pids(self.run_id)
            self._tear_down()
            outcome.leftover_mounts = mounts_under(self.layout.run_dir)
            outcome.leftover_network = netns.leftovers(self.run_id)
            outcome.wall_seconds = time.monotonic() - t0
            log.close()
        return outcome

    def _through_gate(self) -> bool:
        """Start launch 0 held at the gate; once the caller decides, write the recorded
        folder behind the mount and let the ranks go. False: cancelled."""
        self._start(0, time.monotonic())
        fill = self.gate.wait(_CANCELLED) if self.gate is not None else None
        if fill is None:
            return False
        fill(self._recording.mounts[0])
        self.layout.gate_file.touch()
        return True

    def _harness_log(self) -> HistoryWriter:
        """The harness's own stream of the run."""
        return HistoryWriter(self.layout.harness_history, source="harness")

    def _set_up_faults(self, log: HistoryWriter) -> None:
        """Let each fault kind set up what its faults need for the whole job."""
        ctx = JobContext(self.layout.run_dir, self.run_id, self.network, self.store_port,
                         node_pids=self._node_pids)
        if self.record is not None:
            self._recording = get_kind("storage").setup_recording(self.record, ctx)
            self.resources.append(self._recording)
        for name in dict.fromkeys(f.kind for f in self.faults):
            mine = [f for f in self.faults if f.kind == name]
            ctx.resources[name] = get_kind(name).setup_job(mine, ctx)
            self.resources.append(ctx.resources[name])
        outside = [f for f in self.faults if get_kind(f.kind).side == "harness"]
        if outside:
            self.nemesis = Nemesis(outside, ctx, log,
                                   lambda fault, c: get_kind(fault.kind).cut(fault, c))

    def _node_pids(self, index: int) -> list[int]:
        """Node `index`'s processes of the current launch: its agent and all under it."""
        if index >= len(self.nodes):
            return []
        return procs.tree([self.nodes[index].pid])

    def _tear_down(self) -> None:
        """Heal every harness fault, close the kinds' resources, remove the network."""
        try:
            if self.nemesis is not None:
                self.nemesis.close()
            for resource in reversed(self.resources):
                resource.close()
        finally:
            shortcuts.release(self.run_id)
            if self.network is not None:
                self.network.close()

    def _container_nodes(self) -> Network:
        from torchchaos.host.docker.nodes import ContainerNetwork, shared_folders

        script_dir = Path(self.scenario.script).resolve().parent
        shared = shared_folders(self.layout.run_dir, script_dir,
                                *(Path(link) for link in self.scenario.links),
                                *([self.reference] if self.reference is not None else []))
        return ContainerNetwork(self.run_id, self.scenario.nodes, shared,
                                self.layout.run_dir).create()

    def _replace_dead_machines(self, codes: list[int | None]) -> None:
        """A node whose torchrun agent was killed by a signal went down with its machine:
        on container nodes the next launch gets a new one, its local disk empty."""
        replace = getattr(self.network, "replace", None)
        if replace is None:
            return
        for node, code in enumerate(codes):
            if code is not None and code < 0:
                replace(node)

    def _start(self, launch: int, t0: float) -> None:
        extra = {k: v for r in self.resources for k, v in r.environ.items()}
        if self.gate is not None and launch == 0:
            extra[env.GATE] = str(self.layout.gate_file)
        environ = job_environment(self.scenario, self.layout.run_dir, self.run_id, launch, t0,
                                  self.reference, extra, self.seen_at)
        port = self.store_port
        proxied = next((r.rendezvous_endpoint for r in self.resources if r.rendezvous_endpoint),
                       None)
        self.nodes = []
        for node in range(self.scenario.nodes):
            log_path = self.layout.logs_dir / f"launch-{launch}-node-{node}.log"
            command = torchrun_command(self.scenario, node, self.run_id, port,
                                       self.seen_at or self.layout.run_dir, self.network,
                                       proxied, warm=self.warm)
            if self.seen_at is not None:
                command = seen_at.command(self.layout.run_dir, self.seen_at, command)
            node_environ = environ
            if self.network is not None:  # gloo and NCCL: the node's own interface
                node_environ = {"GLOO_SOCKET_IFNAME": netns.INTERFACE,
                                "NCCL_SOCKET_IFNAME": netns.INTERFACE,
                                # NCCL would see one host and bypass the network (shared
                                # memory, P2P), where a partition cannot cut it
                                "NCCL_HOSTID": f"torchchaos-{self.run_id}-node-{node}",
                                **environ}
            served = spare.launch(command, node_environ, str(self.layout.run_dir),
                                  str(log_path))
            if served is not None:  # forked from a launcher held ready (harness.spare)
                self.nodes.append(served)
                continue
            with open(log_path, "ab") as log_file:
                self.nodes.append(subprocess.Popen(
                    command, cwd=self.layout.run_dir, env=node_environ, stdin=subprocess.DEVNULL,
                    stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                ))

    def _wait(self, deadline: float,
              log: HistoryWriter) -> tuple[list[int | None], str | HangFinding | GaveUp]:
        """Wait until every node exited, one failed, every rank stopped as asked, the job
        hung, its resume died twice the same way or the deadline passed. Returns the exit
        codes and "exited", "stopped", "deadline", the hang or why it gave up."""
        while True:
            if _CANCELLED.is_set():
                raise KeyboardInterrupt("cancelled")
            codes = [p.poll() for p in self.nodes]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                return codes, "exited"
            if self._all_stopped():
                return codes, "stopped"
            if time.monotonic() > deadline:
                return codes, "deadline"
            if self.nemesis is not None:
                self.nemesis.poll()
                self.hangs.excuse_until(self.nemesis.heals_by())
            exits, hang = self.hangs.poll()
            for beat in exits:  # the job reacting: a rank is gone
                log.record("rank_exit", rank=beat.rank, pid=beat.pid, step=beat.step,
                           launch=beat.launch, attempt=beat.attempt)
            if hang is not None and hang.in_start_up and self._starting.busy():
                # a start-up (or restart) burning CPU on a loaded machine, not a stall: the
                # bound counts again from now
                self.hangs.excuse_until(time.monotonic())
            elif hang is not None:
                return codes, hang
            if why := self.repeats.poll(exits):
                return codes, GaveUp(why)
            time.sleep(POLL_SECONDS)

    def _capture_hang(self, hang: HangFinding, log: HistoryWriter) -> dict[str, Any]:
        """Take every hung rank's stacks into the run, record the hang, say where."""
        if hang.between_attempts:
            return self._capture_stalled_agents(hang, log)
        ranks, texts = [], []
        # a beat is up to half a second old; the history has each rank's true last step
        last_step = {e["pid"]: e["step"] for e in History.of_run(self.layout.run_dir).steps()}
        for rank in hang.ranks:
            rank.step = last_step.get(rank.pid, rank.step)
            text, taken = self._take_stacks(rank.pid, f"rank-{rank.rank}",
                                            self.layout.faulthandler_file(rank.rank, rank.pid))
            if rank.state == "waiting" and text and not stacks.waits_in_framework(text):
                rank.state = "stuck"  # not in a collective: the likely cause, not a victim
            if rank.state == "frozen":  # alive, running no Python: who holds the GIL?
                gil = self._gil_holder(rank.pid, f"rank-{rank.rank}")
                if "gil_holder" in gil:
                    gil["where"] = f"{taken['where']}; the GIL held in {gil['gil_holder']}"
                taken.update(gil)
            ranks.append({**rank.to_dict(), **taken})
            texts.append(text)
        hang.at_exit = self._ended_training(hang, texts)
        ranks.sort(key=lambda r: STATE_ORDER.index(r["state"]))  # stable: idle longest first
        event = self._record_hang(hang, log, ranks=ranks, at_exit=hang.at_exit)
        culprit = ranks[0]
        if hang.at_exit:
            self.progress(f"hung at exit: every rank had ended its training; rank"
                          f" {culprit['rank']} stuck {hang.seconds:.0f} s after step"
                          f" {culprit['step']} in {culprit['where']}; tearing it down")
            return event
        self.progress(f"hang: no progress for {hang.seconds:.0f} s; rank {culprit['rank']}"
                      f" {culprit['state']} after step {culprit['step']} in {culprit['where']};"
                      " tearing the job down")
        return event

    def _ended_training(self, hang: HangFinding, texts: list[str]) -> bool:
        """Had every hung rank ended its training? Their marks say so (`hang.at_exit`), but
        only at the reference's final step: a rank told to stop (SIGTERM) may save and tear
        down mid-run. Without marks, a rank at the final step whose script has returned
        (its main thread holds only `<module>` frames, or the interpreter's exit) hangs at
        exit too: a DDP model freed as `main()` returns deadlocks gloo's teardown before
        any exit hook runs. Without a reference (the reference run), the marks decide."""
        final = self._reference_final_step()
        if final is None:
            return hang.at_exit
        if any(rank.step is None or rank.step < final for rank in hang.ranks):
            return False
        return hang.at_exit or all(stacks.script_returned(text) for text in texts)

    def _reference_final_step(self) -> int | None:
        if self.reference is None:
            return None
        if self._final_step is None:
            self._final_step = History.of_run(self.reference).final_step()
        return self._final_step

    def _capture_stalled_agents(self, hang: HangFinding, log: HistoryWriter) -> dict[str, Any]:
        """No worker is left: the torchrun agents' stacks say what they wait for."""
        final = self._reference_final_step()
        if hang.at_exit and final is not None:  # ranks that exited cleanly mid-run (told
            # to stop) left torchrun to restart them: a hang there is no hang at exit
            reached: dict[int, int] = {}
            for e in History.of_run(self.layout.run_dir).steps():
                reached[e["rank"]] = max(reached.get(e["rank"], 0), e["step"])
            hang.at_exit = bool(reached) and min(reached.values()) >= final
        agents = [{"node": node, "pid": proc.pid,
                   **self._take_stacks(proc.pid, f"torchrun-node-{node}", None)[1]}
                  for node, proc in enumerate(self.nodes) if proc.poll() is None]
        event = self._record_hang(hang, log, ranks=[], between_attempts=True, agents=agents,
                                  at_exit=hang.at_exit)
        where = "; ".join(f"node {a['node']} in {a['where']}" for a in agents)
        if hang.at_exit:
            self.progress(f"hung at exit: every rank had ended its training and exited;"
                          f" torchrun did not end (torchrun: {where or 'gone'}); tearing it"
                          " down")
            return event
        self.progress(f"hang: every rank exited {hang.seconds:.0f} s ago and no new attempt"
                      f" started (torchrun: {where or 'gone'}); tearing the job down")
        return event

    def _take_stacks(self, pid: int, name: str,
                     fallback: Path | None) -> tuple[str, dict[str, str]]:
        """`pid`'s stacks, written to `_chaos/stacks/NAME.txt`; the text and what the
        hang event says about them."""
        text, how = stacks.capture(pid, fallback)
        dump = self.layout.stacks_dir / f"{name}.txt"
        if text:
            dump.write_text(text)
            where = stacks.summarize(text)
        else:  # never an empty file: a reader must learn why there is no stack
            where = f"no stack could be taken ({how})"
            dump.write_text(f"no stack could be taken of process {pid}: {how}\n")
            how = "none"
        return text, {"where": where, "stack_tool": how,
                      "stacks": str(dump.relative_to(self.layout.run_dir))}

    def _gil_holder(self, pid: int, name: str) -> dict[str, str]:
        """A frozen rank's native stacks (`_chaos/stacks/NAME.native.txt`) and, where one
        thread alone is not waiting for the GIL, its frame: "where" says it."""
        text = stacks.native(pid)
        if not text:
            return {}
        dump = self.layout.stacks_dir / f"{name}.native.txt"
        dump.write_text(text)
        found = {"native_stacks": str(dump.relative_to(self.layout.run_dir))}
        holder = stacks.gil_holder(text)
        return {**found, "gil_holder": holder} if holder else found

    def _record_hang(self, hang: HangFinding, log: HistoryWriter, **found: Any) -> dict[str, Any]:
        return log.record("hang", seconds=round(hang.seconds, 1), timeout=self.hangs.timeout,
                          after_exit=hang.after_exit, **found,
                          stacks_dir=str(self.layout.stacks_dir.relative_to(self.layout.run_dir)))

    def _all_stopped(self) -> bool:
        if not self.scenario.stop_after or self.reference is None:
            return False
        stopped = sum(1 for _ in self.layout.stopped_dir.iterdir())
        return stopped >= self.scenario.world_size

    def _reap(self, log: HistoryWriter) -> list[int]:
        killed = procs.reap(self.run_id, [p.pid for p in self.nodes])
        for proc in self.nodes:
            proc.wait()
        if killed:
            log.record("reaped", pids=killed)
        return killed
