"""A Slurm cluster on this machine: munge, slurmctld, N slurmd, optionally slurmdbd.

`Cluster.start(nodes=2)` writes the configuration into a folder of the cluster's
own, starts the daemons in order (munge; the database and slurmdbd where asked;
slurmctld; each slurmd) and returns when every node is idle. `stop()` kills every
process of the cluster, jobs' tasks included, and removes the folder. What this
cluster's jobs see is real Slurm: `sbatch`, `srun`, requeues, time limits,
preemption, `scontrol`, `sacct`, given `env()` (SLURM_CONF names its configuration).

Its folder must be short: munge's socket and each slurmd's step sockets live in it,
and a Unix socket's path has 107 bytes at most. A cluster a harness owns (the
tests', the chaos runs') lives in the state folder as `slurm-<id>`, carries the
run id mark, and is registered with the harness's lifeline before its first
daemon starts: if the harness dies, the lifeline kills the cluster and the next
sweep removes its folder (`torchchaos.host.leftovers`). A cluster started from the
command line (`torchchaos cluster up`) is the user's: no run mark, it lives until
`torchchaos cluster down`.

A node failure (`fail_node`) is what a machine's power loss does to Slurm: its
slurmd, every slurmstepd it started and every task of those steps get SIGKILL at
once; slurmctld finds the node silent, marks it DOWN and ends or requeues its
jobs (NODE_FAIL). `restart_node` is the machine coming back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from torchchaos import env
from torchchaos.errors import CannotJudge, UsageError
from torchchaos.host import cluster_folders as folders
from torchchaos.host import lifeline, procs
from torchchaos.host.slurm import accounting, daemons
from torchchaos.host.slurm.config import Layout, Ports, free_ports, slurm_conf

PROGRAMS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo")
LONGEST_SOCKET_UNDER_ROOT = 40  # spool/<node>/<node>_<job>.<step>, with room to spare
SOCKET_PATH_MAX = 107
RECORD = "cluster.json"  # in the folder: what `torchchaos cluster down` needs


@dataclass
class Cluster:
    layout: Layout
    cluster_id: str
    owned: bool
    processes: list[subprocess.Popen] = field(default_factory=list)

    @classmethod
    def start(cls, nodes: int = 2, root: Path | None = None, accounting_too: bool = False,
              cpus: int = 4, memory_mb: int = 8000, owned: bool = True,
              timeout: float = 60.0) -> Cluster:
        """A running cluster whose nodes are all idle; on any failure nothing is left."""
        if nodes < 1:
            raise UsageError(f"a cluster needs at least one node, not {nodes}")
        daemons.need(*PROGRAMS, *(accounting.PROGRAMS if accounting_too else ()))
        cluster_id = uuid.uuid4().hex[:12]
        root = root if root is not None else folders.owned_root(cluster_id)
        _check_root(root)
        layout = Layout(root.absolute(), tuple(f"n{i}" for i in range(1, nodes + 1)),
                        free_ports(nodes), cpus, memory_mb, accounting_too)
        if owned:
            lifeline.own(cluster_id, layout.root)  # before anything of it exists
        cluster = cls(layout, cluster_id, owned)
        try:
            cluster._boot(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @classmethod
    def of(cls, root: Path) -> Cluster:
        """The cluster `torchchaos cluster up` started in `root`."""
        try:
            record = json.loads((root / RECORD).read_text())
        except (OSError, ValueError):
            raise UsageError(f"{root} holds no cluster (no readable {RECORD})") from None
        ports = Ports(*record["ports"][:3], tuple(record["ports"][3]))
        layout = Layout(root.absolute(), tuple(record["nodes"]), ports, record["cpus"],
                        record["memory_mb"], record["accounting"])
        return cls(layout, record["id"], owned=False)

    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, sacct) needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.layout.slurm_conf)}

    def marks(self, node: str | None = None) -> dict[str, str]:
        marks = {env.CLUSTER: self.cluster_id, **lifeline.lock_env()}
        if self.owned:
            marks[env.RUN_ID] = self.cluster_id
        if node is not None:
            marks[env.CLUSTER_NODE] = f"{self.cluster_id}:{node}"
        return marks

    def _boot(self, timeout: float) -> None:
        layout = self.layout
        for folder in ("state", "spool", "run", "log", "munge", "munge-key"):
            (layout.root / folder).mkdir(parents=True, exist_ok=True)
        layout.slurm_conf.write_text(slurm_conf(layout))
        self._start_munge(timeout)
        if layout.accounting:
            self.processes += accounting.start(layout, {**self.marks(), **self.env()},
                                               timeout)
        controller = daemons.start(["slurmctld", "-D", "-i", "-f", str(layout.slurm_conf)],
                                   layout.log("slurmctld-out"), {**self.marks(), **self.env()})
        self.processes.append(controller)
        daemons.wait_until(lambda: daemons.answers(["scontrol", "ping"], self.env(), "UP"),
                           "slurmctld", controller, layout.log("slurmctld"), timeout)
        for node in layout.nodes:
            self.restart_node(node)
        daemons.wait_until(lambda: self.idle(), "the nodes", None, layout.log("slurmctld"),
                           timeout)
        (layout.root / RECORD).write_text(json.dumps({
            "id": self.cluster_id, "nodes": list(layout.nodes), "cpus": layout.cpus,
            "memory_mb": layout.memory_mb, "accounting": layout.accounting,
            "ports": [layout.ports.controller, layout.ports.accounting,
                      layout.ports.database, list(layout.ports.nodes)]}))

    def _start_munge(self, timeout: float) -> None:
        layout = self.layout
        layout.munge_key.parent.chmod(0o700)
        layout.munge_key.write_bytes(os.urandom(1024))
        layout.munge_key.chmod(0o400)
        munged = daemons.start(
            ["munged", "-F", "--force", f"--key-file={layout.munge_key}",
             f"--socket={layout.munge_socket}", f"--pid-file={layout.pid_file('munged')}",
             f"--seed-file={layout.root / 'run' / 'munged.seed'}",
             f"--log-file={layout.log('munged')}", "--num-threads=4"],
            layout.log("munged-out"), self.marks())
        self.processes.append(munged)
        daemons.wait_until(lambda: layout.munge_socket.exists(), "munged", munged,
                           layout.log("munged"), timeout)

    def restart_node(self, node: str) -> None:
        """Start the node's slurmd (again): the machine is back."""
        slurmd = daemons.start(["slurmd", "-D", "-N", node, "-f", str(self.layout.slurm_conf)],
                               self.layout.logs / f"slurmd-{node}-out.log",
                               {**self.marks(node), **self.env()})
        self.processes.append(slurmd)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo says it (idle, alloc, mix, down*, ...)."""
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                              text=True, timeout=10, env={**os.environ, **self.env()})
        return dict(line.split()[:2] for line in done.stdout.splitlines() if line.split())

    def idle(self) -> bool:
        try:
            states = self.node_states()
        except (OSError, subprocess.TimeoutExpired):
            return False
        return len(states) == len(self.layout.nodes) and set(states.values()) == {"idle"}

    def node_pids(self, node: str) -> list[int]:
        """Every process on the node: its slurmd, the slurmstepds it started (they clear
        their environment and leave its tree, but keep the node's log open), their tasks."""
        mark = f"{self.cluster_id}:{node}"
        marked = [pid for pid, value in procs.env_values((env.CLUSTER_NODE,)).items()
                  if value == mark]
        return procs.tree(sorted(set(marked) | set(procs.holding(self.layout.node_log(node)))))

    def fail_node(self, node: str) -> list[int]:
        """SIGKILL everything on the node at once (see the module's words): the pids."""
        if node not in self.layout.nodes:
            raise UsageError(f"no node {node!r} in this cluster ({', '.join(self.layout.nodes)})")
        killed, survivors = procs.kill_until_gone(lambda: self.node_pids(node), 10.0)
        if survivors:
            raise CannotJudge(f"processes of node {node} survived SIGKILL: {survivors}")
        return killed

    def pids(self) -> list[int]:
        """Every process of the cluster: its daemons, and all that runs on its nodes."""
        marked = [pid for pid, value in procs.env_values((env.CLUSTER,)).items()
                  if value == self.cluster_id]
        on_nodes = [pid for node in self.layout.nodes for pid in self.node_pids(node)]
        return procs.tree(sorted(set(marked) | set(on_nodes)))

    def stop(self) -> list[str]:
        """Kill every process of the cluster (tasks first: they are in the trees), then
        remove its folder. Returns what could not be removed, in words."""
        _, survivors = procs.kill_until_gone(self.pids, 10.0)
        for process in self.processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        failures = [f"processes {survivors} survived SIGKILL"] if survivors else []
        shutil.rmtree(self.layout.root, ignore_errors=True)
        return failures

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _check_root(root: Path) -> None:
    if len(str(root.absolute()).encode()) + LONGEST_SOCKET_UNDER_ROOT > SOCKET_PATH_MAX:
        raise UsageError(f"a cluster's folder must be short (its sockets live in it, and a"
                         f" socket path has {SOCKET_PATH_MAX} bytes at most): {root}")
    if (root / RECORD).exists():
        raise UsageError(f"a cluster is up in {root} already (`torchchaos cluster down"
                         f" --dir {root}` stops it)")
    if root.exists() and any(root.iterdir()):
        raise UsageError(f"{root} is not empty: a cluster starts in a new folder")

