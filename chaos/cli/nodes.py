"""`torchchaos node` and `torchchaos gather`: a multi-node job on real machines."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchchaos.cli.output import print_report, progress_printer
from torchchaos.harness.multinode import (
    REFERENCE_ID,
    NodeSpec,
    default_run_id,
    judge_nodes,
    parse_endpoint,
    run_node,
)
from torchchaos.scenario.model import Scenario
from torchchaos.scenario.spec import parse_fault_spec


def add_commands(sub: Any, count: Callable[[str], int], seconds: Callable[[str], float]) -> None:
    """`torchchaos node` and `torchchaos gather` (`count`, `seconds`: the CLI's parsers
    of non-negative integers and positive seconds)."""
    node = sub.add_parser(
        "node", help="run this machine's part of a multi-node job (one per machine)",
        description="Run on every machine of a multi-node job, each with its own"
        " --node-rank and the same other arguments: launches this machine's torchrun"
        " (c10d rendezvous at --rdzv-endpoint, node 0 hosts it), relaunches it when it dies"
        " (a scheduler requeueing a pod), writes the histories into a run directory in"
        " --shared and a done marker. Without --fault it is the fault-free reference run"
        f" (run id '{REFERENCE_ID}'), which every run with faults needs first. Then"
        " `torchchaos gather SHARED/RUN_ID` judges. Exit 0 when this node's torchrun ended"
        " with 0, 1 when it did not, 2 on a usage or harness error.")
    job = node.add_argument_group("job", "this machine's part of the training job")
    faults = node.add_argument_group("faults", "what is injected")
    output = node.add_argument_group("output", "where the run goes, and what is printed")
    job.add_argument("script", metavar="SCRIPT", help="the training script")
    job.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                     help="arguments for the script")
    job.add_argument("--node-rank", type=count, required=True, metavar="K",
                     help="this machine's number, 0 to M-1 (node 0 hosts the store)")
    job.add_argument("--nnodes", "--nodes", dest="nnodes", type=count, required=True,
                     metavar="M", help="machines in the job")
    job.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc",
                     type=count, default=1, metavar="N", help="ranks per node")
    job.add_argument("--rdzv-endpoint", required=True, metavar="HOST:PORT",
                     help="where every node reaches the rendezvous store on node 0")
    job.add_argument("--local-addr", default=None, metavar="ADDR",
                     help="this machine's address as the other nodes reach it (torchrun's"
                          " --local-addr; the rendezvous gives group ranks in address order)")
    job.add_argument("--rdzv-conf", default="", metavar="KEY=VALUE,...",
                     help="more rendezvous settings for torchrun, e.g. keep_alive_interval=1,"
                          "keep_alive_max_attempt=3: a dead node's peers re-form the job"
                          " after 3 s instead of torch's 15")
    job.add_argument("--link", action="append", default=[], metavar="PATH",
                     help="show PATH in the run directory under its own name (repeatable)")
    job.add_argument("--timeout", type=seconds, default=300.0, metavar="SEC",
                     help="deadline for this node's part (default 300)")
    job.add_argument("--max-restarts", type=count, default=3, metavar="N",
                     help="torchrun elastic restarts per launch (default 3)")
    job.add_argument("--max-relaunches", type=count, default=2, metavar="N",
                     help="times this node's torchrun is relaunched after it died (default 2)")
    faults.add_argument("--fault", action="append", default=[], metavar="SPEC",
                        help="a fault to inject (repeatable; see torchchaos run --help);"
                             " node=K is torchrun's group rank")
    faults.add_argument("--seed", type=count, default=0, metavar="N",
                        help="seed for symbolic fault targets and p= triggers")
    output.add_argument("--shared", type=Path, required=True, metavar="DIR",
                        help="a directory every machine sees at the same path (NFS, Lustre)")
    output.add_argument("--run-id", default=None, metavar="ID",
                        help=f"the run's name in --shared (default '{REFERENCE_ID}' without"
                             " faults, else derived from the faults and the seed)")
    output.add_argument("--reference", type=Path, default=None, metavar="DIR",
                        help=f"the fault-free run (default SHARED/{REFERENCE_ID})")
    output.add_argument("--quiet", action="store_true", help="no progress lines")
    gather_cmd = sub.add_parser(
        "gather", help="judge a multi-node run once every node finished",
        description="Waits for every node's done marker in DIR (a run directory in the"
        " shared directory), merges the nodes' histories and judges them against the"
        " fault-free run (--reference; default: the one the nodes used, else"
        f" DIR/../{REFERENCE_ID}); prints the verdict"
        " table and writes DIR/report.json. Exit status as for `run`.")
    gather_cmd.add_argument("run_dir", type=Path, metavar="DIR")
    gather_cmd.add_argument("--reference", type=Path, default=None, metavar="DIR")
    gather_cmd.add_argument("--check", action="append", default=None, metavar="NAME")
    gather_cmd.add_argument("--max-lost-steps", type=count, default=None, metavar="N")
    gather_cmd.add_argument("--wait", type=seconds, default=300.0, metavar="SEC",
                            help="how long to wait for nodes still running (default 300)")
    gather_cmd.add_argument("--quiet", action="store_true", help="no progress lines")


def cmd_node(ns: argparse.Namespace) -> int:
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    scenario = Scenario(ns.script, args, nproc=ns.nproc, nodes=ns.nnodes, network="host",
                        faults=[parse_fault_spec(text) for text in ns.fault], seed=ns.seed,
                        timeout=ns.timeout, max_restarts=ns.max_restarts,
                        max_relaunches=ns.max_relaunches, links=ns.link)  # run_node validates it
    spec = NodeSpec(ns.shared.resolve(), ns.run_id or default_run_id(ns.fault, ns.seed),
                    ns.node_rank, ns.nnodes, parse_endpoint(ns.rdzv_endpoint), ns.local_addr,
                    ns.rdzv_conf)
    record = run_node(scenario, spec, ns.reference, progress_printer(ns.quiet))
    launches = len(record["exit_codes"])
    print(f"node {spec.node_rank}: {'done' if record['completed'] else 'failed'} after"
          f" {launches} launch(es), exit codes {[c[0] for c in record['exit_codes']]};"
          f" judge with: torchchaos gather {spec.run_dir}")
    return 0 if record["completed"] else 1


def cmd_gather(ns: argparse.Namespace) -> int:
    report = judge_nodes(ns.run_dir, ns.reference, ns.check, ns.wait, progress_printer(ns.quiet),
                    ns.max_lost_steps)
    return print_report(report, ns.run_dir.resolve())


COMMANDS = {"node": cmd_node, "gather": cmd_gather}
