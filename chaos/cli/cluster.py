"""`torchchaos cluster up|down|status`: a Slurm cluster on this machine, for trying the
recipes in deploy/slurm/ before a site's cluster (docs/how-to/slurm.md)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchchaos.host.owners import state_dir

DEFAULT_FOLDER = "cluster"  # in the state folder: /run/torchchaos/cluster for root


def default_root() -> Path:
    return state_dir() / DEFAULT_FOLDER


def add_commands(sub: Any, count: Callable[[str], int]) -> None:
    cluster = sub.add_parser(
        "cluster", help="start or stop a Slurm cluster on this machine (munge, slurmctld,"
        " N slurmd, optionally slurmdbd for sacct)",
        description="A real Slurm cluster on this machine, to try deploy/slurm/ before a"
        " site's cluster: `up` starts munge, slurmctld and N slurmd nodes (and, with"
        " --accounting, a database and slurmdbd for sacct) with a configuration of their"
        " own in DIR, and prints the SLURM_CONF line that points sbatch, squeue and sacct at"
        " it; it stays up until `down`. Needs root and Debian's slurm-wlm and munge"
        " (slurmdbd and mariadb-server for --accounting).")
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    up = actions.add_parser("up", help="start the cluster; print its SLURM_CONF")
    up.add_argument("--nodes", type=count, default=2, metavar="N", help="nodes (default 2)")
    up.add_argument("--cpus", type=count, default=4, metavar="N",
                    help="CPUs each node declares (default 4; not checked against the machine)")
    up.add_argument("--mem-mb", type=count, default=8000, metavar="MB",
                    help="memory each node declares, in MB (default 8000)")
    up.add_argument("--accounting", action="store_true",
                    help="also a database and slurmdbd, so that sacct answers")
    run = _add_run(actions, count)
    for action in (up, actions.add_parser("down", help="stop the cluster, remove its folder"),
                   actions.add_parser("status", help="the cluster's nodes and jobs"), run):
        action.add_argument("--dir", type=Path, default=None, metavar="DIR",
                            help=f"the cluster's folder (default {default_root()}; keep it"
                            " short: its sockets live in it)")


def _add_run(actions: Any, count: Callable[[str], int]) -> Any:
    run = actions.add_parser(
        "run", help="run a training job through Slurm, with the scheduler's faults, and judge"
        " its recovery",
        description="Submit the training job to the cluster as one batch job (`torchchaos"
        " node` on each node, torchrun's rendezvous on the first), first without faults"
        " (once per --shared), then with the --fault given: agent faults as for `node`, and"
        " the scheduler's own (slurm:event=node_fail|time_limit|preempt, see `torchchaos"
        " faults`). The job is submitted with --requeue; a requeued job goes on with the"
        " same run. Prints the verdict table; exit 0 / 1 / 2 as for `run`.")
    run.add_argument("script", metavar="SCRIPT", help="the training script")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                     help="arguments for the script")
    run.add_argument("--shared", type=Path, required=True, metavar="DIR",
                     help="a directory every node sees at the same path; the runs go in it")
    run.add_argument("--nodes", type=count, default=2, metavar="M", help="nodes (default 2)")
    run.add_argument("--nproc", type=count, default=1, metavar="N", help="ranks per node")
    run.add_argument("--fault", action="append", default=[], metavar="SPEC",
                     help="a fault to inject (repeatable)")
    run.add_argument("--seed", type=count, default=0, metavar="N")
    run.add_argument("--timeout", type=float, default=300.0, metavar="SEC",
                     help="deadline of each try of the job (default 300)")
    run.add_argument("--queue-wait", type=float, default=600.0, metavar="SEC",
                     help="how long a job may wait for its nodes before it is cancelled"
                     " (default 600)")
    run.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                     help="one more sbatch option, e.g. --sbatch=--partition=gpu (repeatable)")
    run.add_argument("--keep-hold", action="store_true",
                     help="leave a requeued job to Slurm's hold (about 2 min) instead of"
                     " starting it at once")
    run.add_argument("--site", action="store_true",
                     help="the Slurm this environment names (SLURM_CONF), not the one"
                     " `cluster up` started (node failures need that one)")
    run.add_argument("--check", action="append", default=None, metavar="NAME")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    return run


def _cmd_run(ns: argparse.Namespace, root: Path) -> int:
    import os

    from torchchaos.cli.output import print_report, progress_printer
    from torchchaos.errors import UsageError
    from torchchaos.harness import scheduler
    from torchchaos.host.slurm.cluster import RECORD, Cluster

    if not ns.shared.is_dir():
        raise UsageError(f"--shared {ns.shared}: no such directory")
    if ns.site:
        cluster, environ = None, dict(os.environ)
    elif (root / RECORD).is_file():
        cluster = Cluster.of(root)
        environ = {**os.environ, **cluster.env()}
    else:
        raise UsageError(f"no cluster in {root}: start one with `torchchaos cluster up`, or"
                         " pass --site to use the Slurm this environment names")
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    spec = scheduler.SlurmRun(ns.script, args, ns.shared.resolve(), ns.nodes, ns.nproc,
                              ns.fault, ns.seed, ns.timeout, ns.queue_wait, ns.sbatch,
                              release_requeued=not ns.keep_hold, checks=ns.check)
    report = scheduler.run(spec, cluster, environ, progress_printer(ns.quiet))
    return print_report(report, ns.shared.resolve() / spec.run_id())


def cmd_cluster(ns: argparse.Namespace) -> int:
    from torchchaos.host.slurm.cluster import Cluster

    root = ns.dir if ns.dir is not None else default_root()
    if ns.cluster_command == "run":
        return _cmd_run(ns, root)
    if ns.cluster_command == "up":
        cluster = Cluster.start(ns.nodes, root, ns.accounting, ns.cpus, ns.mem_mb, owned=False)
        print(f"cluster up: {len(cluster.layout.nodes)} node(s) idle"
              f" ({', '.join(cluster.layout.nodes)}), partitions chaos (default) and urgent"
              f"{', sacct' if ns.accounting else ''}; logs in {cluster.layout.logs}")
        print(f"export SLURM_CONF={shlex.quote(str(cluster.layout.slurm_conf))}")
        return 0
    cluster = Cluster.of(root)
    if ns.cluster_command == "status":
        states = cluster.node_states()
        print(" ".join(f"{node}: {state}" for node, state in states.items()) or "no nodes")
        return 0 if states else 1
    from torchchaos.cli.output import print_down

    return print_down("cluster", root, cluster.stop())


COMMANDS = {"cluster": cmd_cluster}
