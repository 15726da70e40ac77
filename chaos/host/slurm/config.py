"""The configuration files of a Slurm cluster on one machine.

Every daemon of the cluster reads its settings from the cluster's own folder and
listens on ports of its own, so two clusters (two pytest workers) and a site's
Slurm on the same machine never meet: munge on a socket in the folder
(`AuthInfo=socket=`), slurmctld and every slurmd on 127.0.0.1 at ports picked free
when the cluster starts, each slurmd told its node name (`slurmd -N n1`).

The settings that differ from a site's are chosen for tests, and each says why:
a node that stops answering is marked down within seconds, not minutes; a job
asked to end gets 5 s between SIGTERM and SIGKILL; two partitions on the same
nodes, so that a job in `urgent` preempts one in `chaos` (SIGTERM, KillWait,
SIGKILL, requeue), as a site's scavenger queue does.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

PARTITION = "chaos"  # the default partition; its jobs can be preempted
URGENT = "urgent"  # a partition on the same nodes whose jobs preempt those of PARTITION
# A preempted job's GraceTime. Not 5: with a grace time, Slurm 22.05 here cancelled the
# job's steps at once and never requeued the job, which was FAILED as soon as its batch
# script ended and still unrequeued 14 s after the grace when the script slept on. With
# none, the job is signalled, given KillWait and requeued ("DUE TO PREEMPTION").
GRACE_SECONDS = 0
# A cancelled or timed-out job's time between SIGTERM and SIGKILL. Each node's harness
# reaps its torchrun and writes its done marker in it; at 5 (srun: "up to 7 seconds") a
# loaded CI machine's node 1 was SIGKILLed first and the run could not be judged.
KILL_WAIT_SECONDS = 15
CREDENTIAL_SECONDS = 10  # AuthInfo=cred_expire: also a requeued job's hold (+ 1 s)
NODE_TIMEOUT_SECONDS = 5  # SlurmdTimeout: a node silent this long is down


@dataclass(frozen=True)
class Ports:
    controller: int
    accounting: int
    database: int
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """Where one cluster keeps everything: `root` and the paths under it."""

    root: Path
    nodes: tuple[str, ...]
    ports: Ports
    cpus: int = 4  # declared per node (the node's real count is not checked)
    memory_mb: int = 8000  # declared per node
    accounting: bool = False  # slurmdbd and a database, for sacct

    @property
    def slurm_conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def dbd_conf(self) -> Path:
        return self.root / "slurmdbd.conf"  # slurmdbd finds it beside slurm.conf

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "socket"

    @property
    def munge_key(self) -> Path:
        return self.root / "munge-key" / "munge.key"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def database(self) -> Path:
        return self.root / "db"

    def log(self, daemon: str) -> Path:
        return self.logs / f"{daemon}.log"

    def node_log(self, node: str) -> Path:
        """slurmd's log (SlurmdLogFile): every slurmstepd of the node holds it open."""
        return self.logs / f"slurmd-{node}.log"

    def pid_file(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"


def free_ports(nodes: int) -> Ports:
    """Ports free on 127.0.0.1 now: one for slurmctld, slurmdbd, the database, each node.
    All are held open together while picked, so no two are the same."""
    held = []
    try:
        for _ in range(3 + nodes):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
        numbers = [s.getsockname()[1] for s in held]
    finally:
        for sock in held:
            sock.close()
    return Ports(numbers[0], numbers[1], numbers[2], tuple(numbers[3:]))


def host_name() -> str:
    """The name slurmctld and slurmd compare with their own (gethostname, up to a dot)."""
    return socket.gethostname().split(".")[0]


def slurm_conf(layout: Layout) -> str:
    root, ports, host = layout.root, layout.ports, host_name()
    lines = [
        "# written by torchchaos for a cluster on this machine (torchchaos cluster)",
        "ClusterName=chaos",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports.controller}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # a requeued job waits for its last credentials to expire: 11 s here, not 121
        f"AuthInfo=socket={layout.munge_socket},cred_expire={CREDENTIAL_SECONDS}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={layout.pid_file('slurmctld')}",
        f"SlurmdPidFile={root / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={layout.log('slurmctld')}",
        f"SlurmdLogFile={layout.logs / 'slurmd-%n.log'}",
        # no cgroups: tasks stay in the slurmd's process tree, which a node failure kills
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",  # the declared CPUs and memory, not the real
        f"SlurmdTimeout={NODE_TIMEOUT_SECONDS}",
        "ReturnToService=2",  # a node whose slurmd comes back is idle again
        f"KillWait={KILL_WAIT_SECONDS}",
        "MinJobAge=600",  # an ended job stays in `scontrol show job` for 10 minutes
        "JobRequeue=1",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "InactiveLimit=0",
    ]
    if layout.accounting:
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={ports.accounting}",
            f"AccountingStoragePass={layout.munge_socket}",  # the munge socket, for sacct too
            "JobAcctGatherType=jobacct_gather/linux",
        ]
    for name, port in zip(layout.nodes, ports.nodes):
        lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port}"
                     f" CPUs={layout.cpus} RealMemory={layout.memory_mb} State=UNKNOWN")
    nodes = ",".join(layout.nodes)
    lines += [
        f"PartitionName={PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP"
        f" PriorityTier=1 GraceTime={GRACE_SECONDS}",
        f"PartitionName={URGENT} Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=2"
        " PreemptMode=OFF",
    ]
    return "\n".join(lines) + "\n"


def dbd_conf(layout: Layout) -> str:
    ports = layout.ports
    return "\n".join([
        "# written by torchchaos for a cluster on this machine (torchchaos cluster)",
        "AuthType=auth/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={ports.accounting}",
        "SlurmUser=root",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={ports.database}",
        "StorageUser=root",
        f"LogFile={layout.log('slurmdbd')}",
        f"PidFile={layout.pid_file('slurmdbd')}",
    ]) + "\n"
