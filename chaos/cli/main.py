"""The `torchchaos` command line.

Exit status: 0 every check held; 1 a check failed (the target has a bug);
2 the harness could not judge (bad arguments, the target fails without
faults, a harness error), always with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from torchchaos.cli import multinode
from torchchaos.cli.output import print_report, progress_printer
from torchchaos.errors import CannotJudge, ChaosError, UsageError
from torchchaos.faults.registry import get_kind
from torchchaos.harness.reference import check_cache_dir, default_cache_dir
from torchchaos.host import leftovers, owners

if TYPE_CHECKING:
    from torchchaos.explore.battery import Entry
    from torchchaos.scenario.model import Scenario

EPILOG = """\
fault specs (KIND:key=value,...):
  kill:rank=1,step=30                    SIGKILL rank 1 after its 30th optimizer step
  kill:rank=0,step=30,signal=SIGTERM     preemption notice (SIGKILL after grace=30 s)
  kill:node=0,step=30                    the whole node: its torchrun agent and workers
  kill:rank=0,phase=checkpoint_save,event=3
                                         after the 3rd file event of rank 0's 1st save
                                         (save=K picks the K-th save)
  kill:rank=one,time=12.5                a seeded random rank, 12.5 s after the start
  bitflip:rank=1,step=20,tensor=param,bit=exp_high
                                         flip a high exponent bit of a seeded weight on
                                         rank 1 after step 20 (tensor=grad|optim|
                                         activation|loss|checkpoint; value=nan|inf)
  partition:node=1,step=10,for=6         cut node 1 off for 6 s (--nodes 2+, as root;
                                         shape=halves|majority|oneway|store, sides=0+1/2)
  targets: rank=N | node=N | rank=one; triggers: step= | phase= | time= | p=

exit status: 0 all checks held, 1 a check failed, 2 could not judge.
{run_dir} in ARGS becomes each run's own directory (also its working directory).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        raise UsageError(message)


def _add_optional_script(parser: argparse.ArgumentParser) -> None:
    """SCRIPT [ARGS...], where no SCRIPT means the bundled reference target."""
    parser.add_argument("script", metavar="SCRIPT", nargs="?", default=None,
                        help="the training script (default: the bundled reference target)")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script")


def _add_parallel(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                        help="chaos runs at a time (default 1). Each run is a whole job"
                             " (NPROC x NODES processes): raise it where cores are left over;"
                             " runs that share cores are slower, and timing bounds (lost"
                             " seconds, hang detection) noisier")
    parser.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                        help="run only shard I of N of the planned runs (runs I, I+N, ...;"
                             " every shard makes or reuses the same reference): one per"
                             " machine, then `torchchaos merge` their --out folders into one"
                             " report. 'auto': I and N from a CI matrix"
                             " (TORCHCHAOS_SHARD_INDEX/COUNT), a Kubernetes Indexed Job"
                             " (JOB_COMPLETION_INDEX, TORCHCHAOS_SHARD_COUNT) or a Slurm job"
                             " array (SLURM_ARRAY_TASK_ID/COUNT)")
    _add_junit(parser)


def _add_junit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--junitxml", type=Path, default=None, metavar="FILE",
                        help="also write JUnit XML: one test case per run (fail: a failure"
                             " naming the failing checks; could not judge: an error)")


def _shard(text: str) -> Any:
    """A Shard, or "auto" (read from the environment when the sweep starts)."""
    from torchchaos.explore.shards import Shard

    if text == "auto":
        return text
    try:
        return Shard.parse(text)
    except ChaosError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a value >= 0, got {value}")
    return value


def _count(text: str) -> int:
    """How many of something to do: 0 would start a reference run for nothing."""
    value = _positive_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a value >= 1, got {value}")
    return value


def _version() -> str:
    """'torchchaos 0.1.0 (torch 2.13.0, Python 3.11.7)': what a bug report needs."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torchchaos

    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "not installed"
    python = platform.python_version()
    return f"torchchaos {torchchaos.__version__} (torch {torch}, Python {python})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="torchchaos", description="Inject faults into a real torchrun"
                     " training job and judge its recovery against a fault-free reference.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    run = sub.add_parser("run", help="run a chaos scenario against a training script",
                         epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--fault", action="append", default=[], metavar="SPEC",
                     help="a fault to inject (repeatable; see below)")
    _add_job_options(run)
    run.add_argument("script", metavar="SCRIPT", help="the training script (run under torchrun)")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                     help="arguments for the script")
    battery = sub.add_parser(
        "battery", help="run the standard kill battery and print one verdict table",
        description="Kill each rank mid-interval, a whole node, a rank inside a checkpoint"
        " save, and preempt rank 0 with SIGTERM; one chaos run each, judged against one"
        " cached fault-free reference. With no SCRIPT, runs the bundled reference target"
        " (targets/ddp_lm.py --steps 20 --ckpt-every 5).")
    _add_job_options(battery)
    _add_parallel(battery)
    _add_optional_script(battery)
    doctor = sub.add_parser(
        "doctor", help="check that a script can be judged: runs, seeded, saves, resumes",
        description="Answers a new user's first questions about a script from real runs,"
        " before any campaign: does it run under torchchaos (its working directory is the"
        " run directory), is it seeded (two fault-free runs agree bitwise), do its weights"
        " change, where and how often does it save, does it fsync what it saves, and does"
        " it resume (one kill between two checkpoints, judged in full). Each line is ok,"
        " WARN (judging works, a check may fail) or FAIL (fix it first), with what to do."
        " Exit 0 when nothing FAILs, 1 when something does, 2 on bad input. With no"
        " SCRIPT, examines the bundled reference target.")
    _add_job_options(doctor)
    _add_optional_script(doctor)
    points = sub.add_parser(
        "crashpoints", help="judge every crash state of one checkpoint save",
        description="Runs the job once to the step after save --save with the fault"
        " filesystem recording its checkpoint folder (every operation of every rank, with"
        " its bytes), then enumerates the crash states of that save from the record, in each"
        " --mode: kill (the job dies after an operation; the page cache survives), torn (a"
        " write reaches the disk only in part) and lose_unsynced (a power loss: each pending"
        " unsynced file or folder change is kept or lost, every combination up to 16 a point)."
        " Each state's folder is given to a fresh start of the job, which recovers and runs"
        " --steps-after-resume steps; states that show a recovery the same names and bytes"
        " where it looked share one recovery run. Each state is judged with the checks of a"
        " chaos run. More states than --cap: a seeded sample. The recording is kept in the"
        " cache beside the reference, so that the shards of one sweep judge the same"
        " states. --per-point instead runs one"
        " whole chaos run per file event of the save (the mode before recordings). With no"
        " SCRIPT, runs the bundled reference target.")
    _add_job_options(points)
    _add_parallel(points)
    points.add_argument("--save", type=_count, default=2, metavar="K",
                        help="which checkpoint save to enumerate (default 2: the first one"
                             " that has an earlier checkpoint to fall back to)")
    points.add_argument("--mode", action="append", default=None, metavar="MODE",
                        help="kill, lose_unsynced, torn (repeatable; default all three)")
    points.add_argument("--cap", type=_count, default=None, metavar="N",
                        help="judge at most N crash states (--per-point: N points), sampled"
                             " with --seed (default: every state; 50 points)")
    points.add_argument("--steps-after-resume", type=_positive_int, default=3, metavar="N",
                        help="end each point N steps after its recovery: the restore and"
                             " the first steps after it are what a crash point tests"
                             " (default 3; 0 runs every point to the last step)")
    points.add_argument("--from-scratch", action="store_true",
                        help="start every point at step 0 instead of from a snapshot of the"
                             " checkpoints before the save under test (the reference run"
                             " takes it; --per-point only)")
    points.add_argument("--per-point", action="store_true",
                        help="one whole chaos run per file event and mode, crashing the job"
                             " for real (slower: no recording, no shared recoveries)")
    points.add_argument("--record-only", action="store_true",
                        help="make the reference and the recording of save --save in the"
                             " cache, judge nothing: then hand the --cache-dir to every"
                             " --shard (shards must judge one recording; two recordings of"
                             " one save differ in temporary names and interleavings)")
    _add_optional_script(points)
    campaign = sub.add_parser(
        "campaign", help="N seeded bit flips, one run each, and the outcome table",
        description="Each run flips one bit (a seeded element of a seeded tensor kind, bit"
        " class, rank and step) and is classified as masked, detected, silent divergence,"
        " crash or hang; the table counts them by bit class and tensor kind, and"
        " campaign.json keeps every run's details. With no SCRIPT, runs the bundled"
        " reference target without its defences (--no-sdc-defences); pass the target and"
        " its flags to measure a defended one. Exit 0 once every run was judged.")
    _add_job_options(campaign)
    _add_parallel(campaign)
    campaign.add_argument("--runs", type=_count, default=20, metavar="N",
                          help="how many flips (default 20)")
    campaign.add_argument("--tensor", action="append", default=None, metavar="KIND",
                          help="param, grad, optim, activation (repeatable; default all)")
    campaign.add_argument("--bit", action="append", default=None, metavar="CLASS",
                          help="sign, exp_high, exp_low, mant_high, mant_low (repeatable;"
                               " default all)")
    _add_optional_script(campaign)
    _add_exploration_commands(sub)
    multinode.add_commands(sub, _positive_int, _positive_seconds)
    _add_export_command(sub)
    merge = sub.add_parser(
        "merge", help="join the --out folders of a sharded battery, crashpoints, campaign"
        " or search",
        description="Joins the --out folders of every shard of one `battery`,"
        " `crashpoints` or `campaign` run with --shard I/N into one: their run"
        " folders (hard-linked where the filesystem allows, else copied) and the table,"
        " index.html, campaign.json and JUnit XML the unsharded command writes. For"
        " `search` shards (searches with seeds of their own): each shard's result, and the"
        " smallest failing schedule of all in OUT/minimal.yaml. Refuses shards of"
        " different plans or options, a shard given twice and a missing one. Exit status"
        " as the unsharded command's.")
    merge.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                       help="the --out folder of each shard")
    merge.add_argument("--out", type=Path, required=True, metavar="DIR",
                       help="new directory for the merged runs")
    _add_junit(merge)
    report = sub.add_parser("report", help="print the verdict table of a finished run")
    report.add_argument("out", type=Path, metavar="DIR", help="a --out directory of `run`")
    sub.add_parser("faults", help="list the fault kinds and their parameters")
    clean = sub.add_parser(
        "clean", help="list (or, with --yes, remove) what dead harnesses left behind",
        description="Finds what torchchaos runs left on this machine whose harness is dead"
        " (killed by SIGKILL, the OOM killer or a CI timeout, and its watcher too):"
        " processes carrying a run's mark, network namespaces, veth links and bridges of"
        " simulated nodes, fault filesystem mounts, and dead harnesses' lock files. Lists"
        " them; --yes removes them. What a live harness owns is never touched. Each"
        " harness also removes these when it starts, and the pytest plugin at session"
        " start. Exit 0 when nothing is left (or all was removed), 1 when leftovers were"
        " listed but not removed, or some could not be removed.")
    clean.add_argument("--yes", action="store_true", help="remove what is listed")
    sub.add_parser("suite", add_help=False,
                   help="run the ready-made pytest suites: pytest --pyargs torchchaos.suites"
                        " [PYTEST ARGS] (--chaos-script PATH --chaos-args '...',"
                        " -m chaos_kills, ...)")
    return parser


def _add_exploration_commands(sub: Any) -> None:
    """replay, search and shrink: reproduce a run, find a breaking schedule, minimise one."""
    replay = sub.add_parser(
        "replay", help="run a scenario file again (a run's replay.yaml, or an incident)",
        description="Runs the scenario a file describes: every run writes one as"
        " OUT/replay.yaml (its resolved schedule and the verdict it came to), and incident"
        " postmortems in suites/incidents/ use the same format. Exit status as for `run`;"
        " the last line says whether the outcome is the one the file expects. A SCRIPT"
        " after the file points the scenario at another training script.")
    replay.add_argument("file", type=Path, metavar="FILE", help="a scenario file (YAML/JSON)")
    _add_run_dirs(replay)
    _add_optional_script(replay)
    search = sub.add_parser(
        "search", help="let Hypothesis look for a fault schedule that breaks the target",
        description="Draws schedules of up to --max-faults faults of the given kinds (steps"
        " from the fault-free reference run: one in the middle of each checkpoint interval)"
        " with Hypothesis, runs each as a chaos run until one fails, shrinks it, and then"
        " drops every fault that is not needed (delta debugging). A failure counts only"
        " when --repeats runs of the schedule all fail; one that fails only sometimes is"
        " reported as flaky. The minimal schedule is saved as OUT/minimal.yaml for"
        " `torchchaos replay`. Exit 1 when a failing schedule was found, 0 when none was"
        " within the budget. With no SCRIPT, runs the bundled reference target.")
    _add_job_options(search)
    _add_search_options(search)
    search.add_argument("--kind", action="append", default=None, metavar="KIND",
                        help="kill, preempt, node_kill, save_kill, power_loss, bitflip, hang"
                             " (repeatable; default kill, preempt, save_kill)")
    search.add_argument("--max-faults", type=_count, default=3, metavar="N",
                        help="faults per schedule at most (default 3)")
    search.add_argument("--examples", type=_count, default=20, metavar="N",
                        help="schedules Hypothesis draws before it gives up (default 20)")
    search.add_argument("--shrink-runs", type=_positive_int, default=10, metavar="N",
                        help="runs Hypothesis may spend shrinking the first failure to"
                             " simpler ranks and steps, before delta debugging drops the"
                             " faults it does not need (default 10; 0: delta debugging only)")
    search.add_argument("--every-step", action="store_true",
                        help="faults at any step, not one per checkpoint interval")
    search.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                        help="one of N searches with seeds of their own, each drawing its"
                             " share of --examples (one per machine); `torchchaos merge`"
                             " their --out folders for the smallest failing schedule of all."
                             " 'auto': I and N from the environment, as for battery")
    _add_optional_script(search)
    shrink = sub.add_parser(
        "shrink", help="drop every fault a failing scenario file does not need",
        description="Delta debugging over the faults of a scenario file whose run failed"
        " (a run's replay.yaml): the result still fails, and dropping any one of its"
        " faults makes it pass. Saved as OUT/minimal.yaml. Exit 1 with the minimal"
        " schedule, 2 when the file's schedule does not fail to begin with.")
    shrink.add_argument("file", type=Path, metavar="FILE", help="a scenario file (YAML/JSON)")
    _add_run_dirs(shrink)
    _add_search_options(shrink)


def _add_export_command(sub: Any) -> None:
    """export: a scenario file's node-level faults as Chaos Mesh manifests."""
    from torchchaos.scenario import chaosmesh

    export = sub.add_parser(
        "export", help="write a scenario file's node-level faults as Chaos Mesh manifests",
        description="Kills of nodes, partitions and checkpoint-volume faults of a scenario"
        " file (a run's replay.yaml, an incident) become PodChaos, NetworkChaos and IOChaos"
        " objects in one Chaos Mesh Workflow that starts each at its offset; steps become"
        " seconds. Faults with no cluster counterpart are listed on stderr as not exported.")
    export.add_argument("file", type=Path, metavar="FILE", help="a scenario file (YAML/JSON)")
    export.add_argument("--namespace", default="default", metavar="NS",
                        help="the job's Kubernetes namespace (default default)")
    export.add_argument("--node-label", default=chaosmesh.DEFAULT_NODE_LABEL, metavar="KEY",
                        help="the pod label whose value is the node index (default"
                             f" {chaosmesh.DEFAULT_NODE_LABEL}; e.g."
                             " training.kubeflow.org/replica-index)")
    export.add_argument("--pod-per-rank", action="store_true",
                        help="every rank runs in a pod of its own, labelled with its global"
                             " rank: rank faults map to pods too")
    export.add_argument("--volume-path", default=chaosmesh.DEFAULT_VOLUME_PATH, metavar="PATH",
                        help="where the checkpoint volume is mounted in the pods (IOChaos;"
                             f" default {chaosmesh.DEFAULT_VOLUME_PATH})")
    timing = export.add_mutually_exclusive_group()
    timing.add_argument("--seconds-per-step", type=_positive_seconds, default=None,
                        metavar="S", help="a step takes S seconds (step N fires N*S after start)")
    timing.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                        help="time steps as a run of the job did (its history)")
    export.add_argument("--name", default=None, metavar="NAME",
                        help="prefix of the objects' names (default: from FILE's name)")
    export.add_argument("--bare", action="store_true",
                        help="the chaos objects alone, each annotated with its offset,"
                             " instead of the Workflow")
    export.add_argument("--out", type=Path, default=None, metavar="FILE.yaml",
                        help="write here instead of stdout")
    export.add_argument("--jobset", type=Path, default=None, metavar="DIR",
                        help="also write the job itself, runnable: DIR/reference.yaml (a"
                             " JobSet whose pods, one per node, run `torchchaos node` without"
                             " faults) and DIR/chaos.yaml (the same with the faults Chaos Mesh"
                             " cannot inject, node 0 judging with `torchchaos gather`, then"
                             " the Chaos Mesh Workflow). Pods are selected by the Indexed"
                             " Job's completion-index label unless --node-label is given")
    export.add_argument("--image", default="torchchaos:latest", metavar="IMAGE",
                        help="--jobset: the pods' image, with torchchaos and the script at"
                             " its path relative to here (default torchchaos:latest: this"
                             " repository's Dockerfile)")
    export.add_argument("--claim", default="torchchaos-shared", metavar="NAME",
                        help="--jobset: a ReadWriteMany PersistentVolumeClaim the pods share"
                             " at /shared (default torchchaos-shared)")


def _add_run_dirs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="new directory for the runs and report.json"
                             " (default ./torchchaos-runs/<time>-<id>)")
    parser.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                        help="where fault-free reference runs are cached"
                             " (default $XDG_CACHE_HOME/torchchaos)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def _add_search_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=_positive_int, default=2, metavar="N",
                        help="runs of a failing schedule before its failure is trusted"
                             " (default 2)")
    parser.add_argument("--max-runs", type=_count, default=40, metavar="N",
                        help="chaos runs at most, repeats included (default 40)")


def _add_job_options(run: argparse.ArgumentParser) -> None:
    # torchrun's own names are accepted too: a user's launch line carries over as it is
    run.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc",
                     type=_positive_int, default=2, help="ranks per node (default 2)")
    run.add_argument("--force", action="store_true",
                     help="run even with more than 4 ranks (--nproc x --nodes) per core of"
                          " this machine")
    run.add_argument("--nodes", "--nnodes", dest="nodes", type=_positive_int, default=1,
                     help="simulated nodes, one torchrun agent each (default 1)")
    run.add_argument("--network", choices=("auto", "netns", "host"), default="auto",
                     help="netns: each node in its own network namespace on a private bridge"
                          " (root; needed for partition faults); host: the nodes share the"
                          " machine's loopback; auto (default): netns for 2+ nodes where"
                          " it can be made")
    run.add_argument("--min-nodes", type=_positive_int, default=None, metavar="N",
                     help="elastic job: torchrun may go on with N to --nodes nodes"
                          " (default: exactly --nodes)")
    run.add_argument("--link", action="append", default=[], metavar="PATH",
                     help="show PATH in every run directory under its own name (a symlink;"
                          " repeatable): files the script opens by a fixed relative name,"
                          " since each run starts in a new folder (nanoGPT: --link"
                          " configurator.py --link data)")
    run.add_argument("--check", action="append", default=None, metavar="NAME",
                     help="only these checks (repeatable; default: every check)")
    run.add_argument("--max-lost-steps", type=_positive_int, default=None, metavar="N",
                     help="steps a failure may cost (default: the checkpoint interval"
                          " seen in the reference run)")
    run.add_argument("--max-lost-seconds", type=float, default=None, metavar="S",
                     help="seconds a failure may cost (default: no bound)")
    run.add_argument("--max-detect-steps", type=_positive_int, default=None, metavar="N",
                     help="steps a bit flip may go unnoticed for sdc_detected (default:"
                          " the checkpoint interval, else 10)")
    run.add_argument("--hang-timeout", type=_positive_seconds, default=None, metavar="SEC",
                     help="the job is hung once no rank made progress for SEC seconds: the"
                          " harness then takes every rank's stacks and tears it down; the"
                          " target's own timeout or watchdog must fire before (default 10,"
                          " or 3x the longest the fault-free run went without progress)")
    run.add_argument("--seed", type=_positive_int, default=0,
                     help="seed for symbolic fault targets and p= triggers")
    run.add_argument("--timeout", type=float, default=300.0, metavar="SEC",
                     help="deadline for each run, reference and chaos (default 300)")
    run.add_argument("--max-restarts", type=_positive_int, default=3,
                     help="torchrun elastic restarts per launch (default 3)")
    run.add_argument("--max-relaunches", type=_positive_int, default=2,
                     help="times the whole job is requeued after it died (default 2)")
    run.add_argument("--reference-runs", type=int, default=1, choices=(1, 2),
                     help="2 also proves the target deterministic without faults")
    run.add_argument("--full-fingerprints", action="store_true",
                     help="fingerprint every step of the chaos run in full (default: in full"
                          " for 5 steps after each start, load and fault, parameters, learning"
                          " rates and batch on the steps between)")
    run.add_argument("--mtbf", type=float, default=3.0, metavar="HOURS",
                     help="mean time between failures for the report's Young/Daly checkpoint"
                          " interval (default 3: a large job's interruption rate)")
    _add_run_dirs(run)


def _scenario(ns: argparse.Namespace, script: str, args: list[str], faults: list[str]) -> Any:
    from torchchaos.scenario.model import Scenario

    args = args[1:] if args[:1] == ["--"] else args
    scenario = Scenario.build(
        script, faults=faults, args=args, nproc=ns.nproc, nodes=ns.nodes, network=ns.network,
        min_nodes=ns.min_nodes, checks=ns.check,
        max_lost_steps=ns.max_lost_steps, max_lost_seconds=ns.max_lost_seconds,
        max_detect_steps=ns.max_detect_steps, hang_timeout=ns.hang_timeout, seed=ns.seed,
        timeout=ns.timeout, max_restarts=ns.max_restarts, max_relaunches=ns.max_relaunches,
        reference_runs=ns.reference_runs, mtbf_hours=ns.mtbf,
        full_fingerprints=ns.full_fingerprints, links=ns.link,
    )
    scenario.check_machine(ns.force)
    return scenario


def _dirs(ns: argparse.Namespace) -> tuple[Path, Path]:
    """--out and --cache-dir, refused here (one line, exit 2) when they hold data or cannot
    be written: before any process starts and before anything (replay.yaml) is written."""
    from torchchaos.engine import check_out_dir

    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    out = (ns.out or Path("torchchaos-runs") / stamp).resolve()
    cache = (ns.cache_dir or default_cache_dir()).resolve()
    check_cache_dir(cache)
    check_out_dir(out)
    _check_junitxml(getattr(ns, "junitxml", None))
    return out, cache


def _check_junitxml(path: Path | None) -> None:
    """The JUnit file is written at the end of a sweep: refuse it now if it cannot be."""
    from torchchaos.rundir.folders import unwritable

    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"--junitxml {path} is a folder; name a file")
    why = unwritable(path.resolve().parent)
    if why:
        raise UsageError(f"--junitxml {path}: {why}; choose another")


def cmd_run(ns: argparse.Namespace) -> int:
    from torchchaos.engine import run_scenario

    scenario = _scenario(ns, ns.script, ns.args, ns.fault)
    out, cache = _dirs(ns)
    report = run_scenario(scenario, out, cache, progress_printer(ns.quiet))
    return print_report(report, out)


def _battery_base(ns: argparse.Namespace) -> tuple[Scenario, Path, Path]:
    """The scenario every run of a battery shares (no fault yet), and its folders;
    with no SCRIPT, the bundled reference target."""
    from torchchaos.explore import battery
    from torchchaos.explore.shards import from_environment

    if getattr(ns, "shard", None) == "auto":  # before any run: a missing variable is bad input
        ns.shard = from_environment()
    if ns.script is None:
        script, args = str(battery.BUNDLED_TARGET), battery.BUNDLED_ARGS
    else:
        script, args = ns.script, ns.args
    base = _scenario(ns, script, args, [])
    return (base, *_dirs(ns))


def _print_battery(entries: list[Entry], out: Path, summary: str = "") -> int:
    from torchchaos.explore import battery

    print(battery.table(entries))
    if summary:
        print(summary)
    print(f"runs: {out} (pages: {out / 'index.html'})")
    return battery.exit_code(entries)


TITLES = {"battery": "torchchaos battery", "crashpoints": "torchchaos crash points",
          "crashstates": "torchchaos crash states", "campaign": "torchchaos bit-flip campaign"}


def _run_sweep(ns: argparse.Namespace, command: str, entries: list[Entry], base: Scenario,
               out: Path, cache: Path, extra: dict[str, object] | None = None) -> list[int]:
    """Run the planned entries (this shard's, with --shard); returns their numbers."""
    from torchchaos.explore import battery

    numbers = ns.shard.numbers(len(entries)) if ns.shard else list(range(1, len(entries) + 1))
    if ns.shard:
        progress_printer(ns.quiet)(f"shard {ns.shard}: runs {', '.join(map(str, numbers))}"
                                   f" of {len(entries)}")
    try:
        battery.run_entries(entries, base, out, cache, progress_printer(ns.quiet),
                            title=TITLES[command], jobs=ns.jobs, numbers=numbers)
    except battery.SweepInterrupted as stop:  # what finished is shown, then exit 130
        _finish_sweep(command, entries, stop.finished, out, ns.junitxml, f"{stop}")
        raise
    if ns.shard:
        from torchchaos.explore.shards import write_manifest

        write_manifest(out, command, TITLES[command], ns.shard, entries, extra)
    return numbers


def _finish_sweep(command: str, entries: list[Entry], numbers: list[int], out: Path,
                  junitxml: Path | None, summary: str = "",
                  rows: list[Entry] | None = None) -> int:
    """What every way of running a sweep ends with: the table (of `rows` where given:
    crash states in groups), the pages, campaign.json, JUnit XML, the exit status; over
    the runs `numbers` (a shard's, or all)."""
    from torchchaos.explore import battery, campaign
    from torchchaos.explore.shards import folder_digits
    from torchchaos.report import junit

    chosen = [entries[n - 1] for n in numbers]
    digits = folder_digits(command)
    battery.write_index(entries, out, TITLES[command], numbers, digits)
    if junitxml is not None:
        junit.write(junitxml, TITLES[command], [
            (f"{n:0{digits}d}", entries[n - 1].name, entries[n - 1].fault,
             entries[n - 1].report, entries[n - 1].error) for n in numbers])
    if command != "campaign":
        return _print_battery(chosen if rows is None else rows, out, summary)
    print(campaign.table(entries, numbers))
    print(f"runs: {out} (details: {campaign.write(entries, out, numbers)};"
          f" pages: {out / 'index.html'})")
    return 2 if any(campaign.outcome(e) == campaign.NOT_JUDGED for e in chosen) else 0


def _merge_searches(searches: list[tuple[Path, dict]], out: Path) -> int:
    """Every search shard's result, and the smallest failing schedule of all (its replay
    file copied to OUT/minimal.yaml); exit 1 when one failed, else 0."""
    import shutil

    from torchchaos.explore.search import describe

    failing = []
    for directory, manifest in searches:
        found, shard = manifest["runs"], "/".join(map(str, manifest["shard"]))
        minimal = found["minimal"]
        print(f"shard {shard}: {found['runs']} run(s), " + (
            f"minimal failing schedule ({len(minimal)} fault(s)): {describe(minimal)}"
            if minimal is not None else "no failing schedule") + f"  ({directory})")
        for schedule in found["flaky"]:
            print(f"  flaky (fails only some of the time): {describe(schedule)}")
        if minimal is not None:
            failing.append((len(minimal), manifest["shard"][0], minimal, directory))
    total = sum(m["runs"]["runs"] for _, m in searches)
    if not failing:
        print(f"no failing schedule in {total} run(s) of {len(searches)} shard(s)")
        return 0
    _, index, minimal, directory = min(failing, key=lambda f: (f[0], f[1]))
    path = shutil.copy2(directory / "minimal.yaml", out / "minimal.yaml")
    print(f"minimal failing schedule ({len(minimal)} fault(s)): {describe(minimal)}"
          f" (shard {index}/{len(searches)})")
    print(f"replay it: torchchaos replay {path}")
    print(f"{total} run(s) in {len(searches)} shard(s)")
    return 1


def cmd_battery(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import battery

    base, out, cache = _battery_base(ns)
    prepare_out_dir(out)
    entries = battery.plan(base, cache, progress_printer(ns.quiet))
    numbers = _run_sweep(ns, "battery", entries, base, out, cache)
    return _finish_sweep("battery", entries, numbers, out, ns.junitxml)


def cmd_merge(ns: argparse.Namespace) -> int:
    from torchchaos.engine import check_out_dir
    from torchchaos.explore import shards

    check_out_dir(ns.out)
    merged = shards.merge(ns.dirs, ns.out)  # checks every shard whole, then writes
    if merged.command == "search":
        return _merge_searches(merged.searches, ns.out)
    numbers = list(range(1, len(merged.entries) + 1))
    summary = ""
    if merged.command == "crashstates":
        from torchchaos.explore import crashsweep

        groups = crashsweep.merged_groups(ns.out / "record", merged.extra, merged.details)
        ran = sum(len(d["recoveries"]) for d in merged.details)
        summary = crashsweep.merged_summary(merged.entries, merged.extra, groups,
                                            len(merged.details), ran)
        return _finish_sweep(merged.command, merged.entries, numbers, ns.out, ns.junitxml,
                             summary, crashsweep.report_rows(merged.entries, numbers, groups))
    if merged.command == "crashpoints":
        failed = sum(1 for e in merged.entries if e.report and e.report.verdict == "fail")
        summary = (f"{len(merged.entries)} of {merged.extra.get('total')} points run,"
                   f" {failed} broke the protocol")
    return _finish_sweep(merged.command, merged.entries, numbers, ns.out, ns.junitxml,
                         summary)


def cmd_doctor(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import doctor

    base, out, cache = _battery_base(ns)
    prepare_out_dir(out)
    findings = doctor.examine(base, cache, out, progress_printer(ns.quiet))
    print(f"torchchaos doctor: {' '.join([base.script, *base.args])}"
          f" ({base.nproc} rank(s) x {base.nodes} node(s))")
    print(doctor.table(findings))
    print(f"runs: {out}")
    return doctor.exit_code(findings)


def cmd_crashpoints(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import crashpoints, crashsweep

    base, out, cache = _battery_base(ns)
    progress = progress_printer(ns.quiet)
    modes = ns.mode or list(crashpoints.MODES)
    if ns.record_only and ns.per_point:
        raise UsageError("--record-only makes the recording crash states are judged from;"
                         " --per-point records nothing")
    if not ns.per_point:
        crashpoints.check_modes(modes)
        if ns.jobs > 1:
            progress("--jobs applies to --per-point: recoveries from a recording run one at"
                     " a time")
        if ns.record_only:
            entry = crashsweep.record_only(base, cache, progress, ns.save)
            print(f"recording of save {ns.save}: {entry}; pass --cache-dir {cache} to the"
                  " shards")
            return 0
        try:
            result = crashsweep.sweep(base, out, cache, progress, ns.save, modes, ns.cap,
                                      ns.steps_after_resume or 3, ns.shard)
        except crashsweep.Interrupted as stop:  # what was judged is shown, then exit 130
            _finish_sweep("crashstates", stop.result.entries, stop.judged, out, ns.junitxml,
                          f"save {ns.save}: {stop}",
                          crashsweep.report_rows(stop.result.entries, stop.judged,
                                                 stop.result.groups()))
            raise
        if ns.shard:
            from torchchaos.explore.shards import CRASH_STATES, write_manifest

            write_manifest(out, CRASH_STATES, TITLES[CRASH_STATES], ns.shard, result.entries,
                           crashsweep.shard_extra(base, result, ns.save, modes, ns.cap),
                           crashsweep.shard_details(result))
        return _finish_sweep("crashstates", result.entries, result.numbers, out, ns.junitxml,
                             crashsweep.summary(result, ns.save),
                             crashsweep.report_rows(result.entries, result.numbers,
                                                    result.groups()))
    found = crashpoints.plan(base, cache, progress, ns.save, modes,
                             50 if ns.cap is None else ns.cap, from_snapshot=not ns.from_scratch)
    prepare_out_dir(out)
    entries = crashpoints.entries(found, ns.save)
    total = found.total
    base.stop_after = ns.steps_after_resume or None
    progress(f"{len(entries)} of {total} crash point(s) in save {ns.save}")
    started = time.monotonic()
    numbers = _run_sweep(ns, "crashpoints", entries, base, out, cache, {"total": total})
    minutes = (time.monotonic() - started) / 60
    ran = [entries[n - 1] for n in numbers]
    failed = sum(1 for e in ran if e.report and e.report.verdict == "fail")
    return _finish_sweep("crashpoints", entries, numbers, out, ns.junitxml,
                         f"{len(ran)} of {total} points run, {failed} broke the protocol;"
                         f" {len(ran) / minutes:.1f} points per minute")


def cmd_campaign(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import battery, campaign
    if ns.script is None:
        ns.script, ns.args = str(battery.BUNDLED_TARGET), [*battery.BUNDLED_ARGS,
                                                           "--no-sdc-defences"]
    base, out, cache = _battery_base(ns)
    progress = progress_printer(ns.quiet)
    entries = campaign.plan(base, cache, progress, ns.runs, ns.seed,
                            ns.tensor or list(campaign.TENSORS),
                            ns.bit or list(get_kind("bitflip").choices["bit"]))
    prepare_out_dir(out)
    numbers = _run_sweep(ns, "campaign", entries, base, out, cache)
    return _finish_sweep("campaign", entries, numbers, out, ns.junitxml)


def cmd_replay(ns: argparse.Namespace) -> int:
    from torchchaos.engine import run_scenario
    from torchchaos.scenario import files as scenario_file

    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    loaded = scenario_file.load(ns.file, ns.script, args if ns.script else None)
    out, cache = _dirs(ns)
    report = run_scenario(loaded.scenario, out, cache, progress_printer(ns.quiet))
    expect = loaded.expect or scenario_file.Expectation()
    mismatches = expect.mismatches(report)
    verdict = f"expected {expect.verdict}" + (" and got it" if not mismatches
                                              else f", but: {'; '.join(mismatches)}")
    return print_report(report, out, f"replay of {ns.file}: {verdict}")


def _save_minimal(base: Scenario, schedule: list[str], out: Path, runs: Any) -> Path:
    """OUT/minimal.yaml: the base scenario with the minimal schedule, expected to fail
    the way its last run failed."""
    import dataclasses

    from torchchaos.scenario import files as scenario_file
    from torchchaos.scenario.spec import parse_fault_spec

    scenario = dataclasses.replace(base, faults=[parse_fault_spec(s) for s in schedule])
    minimal = scenario_file.for_run(scenario, scenario_file.resolve(scenario),
                                    runs.last_run_of(schedule))
    minimal.name = f"minimal failing schedule ({len(schedule)} fault(s))"
    return minimal.save(out / "minimal.yaml")


def _print_search_end(result: Any, runs: Any, out: Path, base: Scenario) -> int:
    """What a search or shrink found (a `torchchaos.explore.search.SearchResult`); exit 1 with a
    failing schedule, else 0."""
    from torchchaos.explore.search import describe

    found, minimal = result.found, result.minimal
    for schedule in result.flaky:
        print(f"flaky (fails only some of the time): {describe(schedule)}")
    if minimal is None:
        print(f"no failing schedule in {len(runs.reports)} run(s); runs: {out}")
        return 0
    if found is not None and found != minimal:
        print(f"first failure, shrunk by Hypothesis: {describe(found)}")
    print(f"minimal failing schedule ({len(minimal)} fault(s)): {describe(minimal)}")
    if result.budget_spent:
        print("  (the run budget ran out while shrinking: a fault of it may still be"
              " droppable; raise --max-runs)")
    report = runs.last_run_of(minimal)
    if report is not None:
        print(report.table())
    path = _save_minimal(base, minimal, out, runs)
    print(f"replay it: torchchaos replay {path}")
    print(f"{len(runs.reports)} run(s); runs: {out}")
    return 1


def cmd_search(ns: argparse.Namespace) -> int:
    from hypothesis.configuration import set_hypothesis_home_dir

    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import search, shards, strategies
    from torchchaos.explore.schedule_runs import ScheduleRuns
    from torchchaos.harness.reference import get_reference

    base, out, cache = _battery_base(ns)
    progress = progress_printer(ns.quiet)
    history = get_reference(base, cache, progress).history()
    shape = strategies.JobShape.of(history, base.nodes, ns.every_step)
    try:
        fault = strategies.faults(shape, ns.kind or ("kill", "preempt", "save_kill"))
    except ValueError as exc:
        raise UsageError(f"--kind: {exc}") from None
    prepare_out_dir(out)
    # Hypothesis keeps a cache in ./.hypothesis; the harness writes only in its run dirs.
    set_hypothesis_home_dir(out / "_hypothesis")
    runs = ScheduleRuns(base, out, cache, progress)
    trials = search.Trials(runs, ns.repeats or 1, ns.max_runs, progress)
    progress(f"searching schedules of up to {ns.max_faults} fault(s) at steps {shape.steps}")
    seed, examples = ns.seed, ns.examples
    if ns.shard:  # its own seed, its share of the examples
        seed, examples = shards.search_seed(ns.seed, ns.shard), -(-ns.examples // ns.shard.count)
        progress(f"shard {ns.shard}: seed {seed}, {examples} example(s)")
    result = search.search(trials, strategies.schedules(fault, ns.max_faults), seed, examples,
                           ns.shrink_runs)
    code = _print_search_end(result, runs, out, base)
    if ns.shard:
        plan = {k: getattr(ns, k) for k in ("seed", "examples", "kind", "max_faults",
                                            "every_step", "repeats", "max_runs",
                                            "shrink_runs")}
        shards.write_search_manifest(out, ns.shard, plan, {
            "runs": len(runs.reports), "found": result.found, "minimal": result.minimal,
            "flaky": result.flaky, "budget_spent": result.budget_spent})
    return code


def cmd_shrink(ns: argparse.Namespace) -> int:
    from torchchaos.engine import prepare_out_dir
    from torchchaos.explore import search
    from torchchaos.explore.schedule_runs import ScheduleRuns
    from torchchaos.scenario import files as scenario_file

    loaded = scenario_file.load(ns.file)
    base = loaded.scenario
    schedule = [f.text for f in base.faults]
    if not schedule:
        raise UsageError(f"{ns.file}: no faults to shrink")
    out, cache = _dirs(ns)
    prepare_out_dir(out)
    progress = progress_printer(ns.quiet)
    runs = ScheduleRuns(base, out, cache, progress)
    trials = search.Trials(runs, ns.repeats or 1, ns.max_runs, progress)
    first = trials.judge(schedule)
    if first != search.FAIL:
        raise CannotJudge(f"{ns.file}: its schedule does not fail to begin with"
                          f" ({first} in {trials.runs} run(s)); nothing to shrink")
    minimal = search.ddmin(schedule, trials.fails)
    result = search.SearchResult(None, minimal, trials.runs, trials.flaky, trials.budget_spent)
    return _print_search_end(result, runs, out, base)


def cmd_export(ns: argparse.Namespace) -> int:
    from torchchaos.scenario import chaosmesh, jobset
    from torchchaos.scenario import files as scenario_file

    loaded = scenario_file.load(ns.file)
    if ns.jobset is not None:
        from torchchaos.engine import prepare_out_dir

        prepare_out_dir(ns.jobset)  # a new folder: no file of the user's is overwritten
    node_label = ns.node_label
    if ns.jobset is not None and node_label == chaosmesh.DEFAULT_NODE_LABEL:
        node_label = jobset.NODE_LABEL  # what the JobSet's pods carry
    options = chaosmesh.Options(
        namespace=ns.namespace, node_label=node_label, volume_path=ns.volume_path,
        seconds_per_step=ns.seconds_per_step, pod_per_rank=ns.pod_per_rank,
        step_times=chaosmesh.step_times(ns.run_dir) if ns.run_dir else None,
        name=ns.name or chaosmesh.name_of(ns.file))
    result = chaosmesh.export(loaded, options)
    text = chaosmesh.render(result, ns.file, options, ns.bare)
    if ns.jobset is not None:
        job = jobset.JobOptions(options.name, ns.namespace, ns.image, ns.claim)
        for path in jobset.write(loaded.scenario, job, result.kept, text, ns.jobset):
            print(f"wrote {path}", file=sys.stderr)
    if ns.out is None:
        sys.stdout.write(text)
    else:
        try:
            ns.out.write_text(text)
        except OSError as exc:
            raise UsageError(f"cannot write {ns.out}: {exc.strerror or exc}") from None
    for line in result.not_exported:
        print(f"not exported: {line}", file=sys.stderr)
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    from torchchaos.report.model import Report

    path = ns.out / "report.json"
    if not path.is_file():
        raise UsageError(f"no report.json in {ns.out}")
    try:
        report = Report.read(path)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{path} is not a torchchaos report: {exc}") from None
    print(report.table())
    from torchchaos.report import html_report

    if html_report.run_dir_of(report, ns.out) is not None:
        print(f"report: {html_report.write_run(report, ns.out)}")
    else:
        print("the run directory is gone: report.html not rewritten")
    if report.verdict == "error":
        print(f"torchchaos: error: {report.reason}", file=sys.stderr)
    return report.exit_code()


def cmd_suite(pytest_args: list[str]) -> int:
    """The suites are pytest modules: `pytest --pyargs torchchaos.suites ARGS`, with pytest's exit
    status (0 all passed, 1 a test failed, 4 bad options, 5 nothing selected)."""
    import pytest

    return int(pytest.main(["--pyargs", "torchchaos.suites", *pytest_args]))


def cmd_clean(ns: argparse.Namespace) -> int:
    found = leftovers.inventory()
    who = owners.owners()  # read after listing: a live run is registered before it exists
    stale = leftovers.stale(found, who)
    # every live harness, wherever it keeps its lock: those of this state folder, those
    # the processes name, those a process holds open
    named = {x.lock for x in found if x.lock}
    live = who.plus(owners.read_live(named)).plus(owners.held_anywhere()).live
    here = owners.state_dir().resolve()
    for harness in live:
        mine = leftovers.of_lock(found, harness)
        elsewhere = "" if harness.path.parent == here else f"; its lock is in {harness.path.parent}"
        print(f"left alone: {len(mine)} thing(s) of live harness pid {harness.pid}"
              f" ({harness.command[:80]}{elsewhere})")
    if not stale:
        print("nothing left behind by dead harnesses")
        return 0
    print(f"{len(stale)} leftover(s) of dead harnesses:")
    for item in stale:
        print(f"  {item.describe()}")
    if not ns.yes:
        print("run `torchchaos clean --yes` to remove them")
        return 1
    failures = leftovers.remove(stale)
    for failure in failures:
        print(f"could not remove {failure}", file=sys.stderr)
    print(f"removed {len(stale) - len(failures)} of {len(stale)}")
    return 1 if failures else 0


def cmd_faults(_ns: argparse.Namespace) -> int:
    from torchchaos.faults.registry import all_kinds

    for name, kind in sorted(all_kinds().items()):
        print(f"{name:<10} {kind.summary}  (parameters: {', '.join(kind.params) or 'none'})")
    return 0


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    # Both signals become KeyboardInterrupt so `finally` blocks heal and reap; SIGINT is
    # set explicitly because a shell's background job starts with it ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        argv = sys.argv[1:] if argv is None else argv
        if argv[:1] == ["suite"]:  # every argument after it is pytest's
            return cmd_suite(argv[1:])
        ns = build_parser().parse_args(argv)
        if ns.command is None:
            build_parser().print_help()
            return 2
        commands = {"run": cmd_run, "battery": cmd_battery, "crashpoints": cmd_crashpoints,
                    "campaign": cmd_campaign, "report": cmd_report, "replay": cmd_replay,
                    "search": cmd_search, "shrink": cmd_shrink,
                    "faults": cmd_faults, "export": cmd_export, "doctor": cmd_doctor,
                    "clean": cmd_clean, "merge": cmd_merge,
                    **multinode.COMMANDS}
        return commands[ns.command](ns)
    except ChaosError as exc:
        print(f"torchchaos: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torchchaos: interrupted; every process of the run was reaped", file=sys.stderr)
        return 130
    except Exception as exc:  # a harness bug: still one line, exit 2
        debug = bool(os.environ.get("TORCHCHAOS_DEBUG"))
        if debug:
            traceback.print_exc()  # the traceback asked for; the exit status stays 2
        where = "the traceback is above" if debug else "set TORCHCHAOS_DEBUG=1 for a traceback"
        print(f"torchchaos: internal error: {type(exc).__name__}: {exc} ({where})",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
