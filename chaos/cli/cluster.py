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
    for action in (up, actions.add_parser("down", help="stop the cluster, remove its folder"),
                   actions.add_parser("status", help="the cluster's nodes and jobs")):
        action.add_argument("--dir", type=Path, default=None, metavar="DIR",
                            help=f"the cluster's folder (default {default_root()}; keep it"
                            " short: its sockets live in it)")


def cmd_cluster(ns: argparse.Namespace) -> int:
    from torchchaos.host.slurm.cluster import Cluster

    root = ns.dir if ns.dir is not None else default_root()
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
    failures = cluster.stop()
    for failure in failures:
        print(f"could not remove {failure}")
    print(f"cluster down: {root} removed" if not failures else "cluster down, with leftovers")
    return 1 if failures else 0


COMMANDS = {"cluster": cmd_cluster}
