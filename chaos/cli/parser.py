"""The `torchchaos` command line's parser: every command, its options and its help.

A command with many options shows them in groups, named by what a user looks
for: `job` (the script, its arguments and how torchrun runs it), `faults` (what
is injected), `checks` (what is judged, and the bounds), `sweeps` (which runs of
many, how many at a time, on which machine) and `output` (where runs and
reports go, what is printed). Groups change the help's layout only: every
option is parsed as it would be without them.
"""

from __future__ import annotations

import argparse
import re
import textwrap
from pathlib import Path
from typing import Any, NoReturn

from torchchaos.cli import cluster, detectors, docker, nodes
from torchchaos.errors import ChaosError, UsageError, did_you_mean

EXAMPLES = """\
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
  miscompute:rank=1,step=20,pattern=warp,every=10
                                         rank 1's device computes every 10th matrix
                                         product wrong from step 20 on, 32 elements at a
                                         time, also after restarts (persist=none: once)
  storage:mode=lose_unsynced,rank=0,step=12
                                         a power loss: what was not fsynced is gone
                                         (FUSE; dir=FOLDER where the job saves, default
                                         ckpt; mode=torn|enospc|eio|slow|bitrot)
  hang:rank=1,step=10,mode=collective    rank 1 held inside its next collective
                                         (mode=stop|spin|mismatch|gil; for=SEC)
  crash:rank=1,step=10,signal=segv       a native crash made by rank 1 (abrt|bus)
  raise:rank=0,phase=checkpoint_save,save=2,event=2,type=OSError
                                         an exception out of a write of rank 0's 2nd save
  oom:rank=1,step=10                     the kernel's OOM killer, under rank 1's own
                                         cgroup limit (limit=MiB; mode=raise: the
                                         allocator's error)
  dataloader:rank=1,step=10              SIGKILL one of rank 1's DataLoader workers
                                         (mode=stop: a stuck worker)
  abort:rank=1,step=10                   rank 1's process group aborted as it trains
  gpu:rank=0,step=10,error=assert        a sticky CUDA error (oom|hang; needs CUDA)
  straggler:rank=1,step=5,delay=0.3,steps=10
                                         rank 1 0.3 s slower per step, for 10 steps
  partition:node=1,step=10,for=6         cut node 1 off for 6 s (--nodes 2+, as root;
                                         shape=halves|majority|oneway|store, sides=0+1/2)
  link:node=1,step=10,loss=5,for=5       drop 5 % of node 1's packets for 5 s (rate= KB/s;
                                         delay=, jitter=, reorder= need netem)
  freeze:node=1,step=10,for=5            node 1 frozen for 5 s, then it goes on (docker
                                         pause, or a freezer cgroup; as root)
  toxic:step=6,type=latency,latency=500,for=4
                                         500 ms more on the rendezvous store's TCP path
                                         for 4 s (Toxiproxy; --nodes 2+, --network host)
  slurm:event=node_fail,node=1,step=12   a Slurm node dies, Slurm requeues the job
                                         (time_limit|preempt; `torchchaos cluster run`)
  targets: rank=N | node=N | rank=one; triggers: step= | phase= | time= | p=
"""

EXIT_STATUS = """\
exit status: 0 all checks held, 1 a check failed, 2 could not judge.
{run_dir} in ARGS becomes each run's own directory (also its working directory).
"""


def run_epilog() -> str:
    """`run --help`'s epilog: examples, then every fault kind the registry knows (the
    built-in ones and those of installed plug-ins that load), so the list cannot drift."""
    from torchchaos.faults.registry import loadable_kinds

    kinds = loadable_kinds()
    width = max((len(name) for name in kinds), default=0)
    lines = ["fault kinds (`torchchaos faults` lists the parameters of each):"]
    for name, kind in sorted(kinds.items()):
        lines += textwrap.wrap(kind.summary or "(no summary)", 96,
                               initial_indent=f"  {name:<{width}}  ",
                               subsequent_indent=" " * (width + 4))
    return "\n".join([EXAMPLES, *lines, "", EXIT_STATUS])


BATTERY_EXAMPLES = """\
examples:
  torchchaos battery --list                   the rows and their faults; runs nothing
  torchchaos battery -k 'kill and not node'   only the rows whose names match
  torchchaos battery -x -- train.py --steps 40
                                              your script; stop at the first row that
                                              does not pass
"""


def battery_epilog() -> str:
    """`battery --help`'s epilog: examples, the bundled target's planted bugs (at its
    path in this installation) and the exit status."""
    from torchchaos.env import package_dir

    target = package_dir("torchchaos.targets") / "ddp_lm.py"
    if target.is_relative_to(Path.cwd()):  # a checkout: targets/ddp_lm.py
        target = target.relative_to(Path.cwd())
    return "\n".join([
        BATTERY_EXAMPLES,
        "The bundled target has planted bugs for the battery to find (--bug NAME:",
        "write_in_place, skip_rng, skip_optim, early_pointer, no_fsync, ...; its docstring",
        "lists them all), e.g.:",
        f"  torchchaos battery -x -- {target} --steps 20 --ckpt-every 5 --bug write_in_place",
        "",
        "exit status: 0 every row passed, 1 a row failed, 2 a row could not be judged (or",
        "bad input, refused before anything runs).",
        ""])


GROUPS = {
    "job": "the training script and how torchrun runs it",
    "faults": "what is injected",
    "checks": "what is judged, and the bounds a recovery is held to",
    "sweeps": "which of many runs, how many at a time, on which machine",
    "output": "where runs, reports and reference runs go, and what is printed",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        raise UsageError(message + _suggestion(self, message))

    def format_help(self) -> str:
        if callable(self.epilog):  # made when asked for: it loads every fault kind
            self.epilog = self.epilog()
        return super().format_help()


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """The close option or command for a typo in an argparse error, or ""."""
    if (m := re.search(r"invalid choice: '([^']+)'", message)):
        choices = re.findall(r"'([^']+)'", message.split("choose from", 1)[-1])
        return did_you_mean(m.group(1), choices)
    if (m := re.search(r"unrecognized arguments: (-\S+)", message)):
        return did_you_mean(m.group(1).split("=")[0], _option_strings(parser))
    return ""


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option of `parser` and of its subcommands."""
    found = {o for o in parser._option_string_actions if o.startswith("--")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


Groups = dict[str, Any]  # group name -> argparse argument group


def _groups(parser: argparse.ArgumentParser, *names: str) -> Groups:
    """The parser's option groups, shown in this order (before `options`, which holds
    only -h)."""
    return {name: parser.add_argument_group(name, GROUPS[name]) for name in names}


def _add_optional_script(group: Any) -> None:
    """SCRIPT [ARGS...], where no SCRIPT means the bundled reference target."""
    group.add_argument("script", metavar="SCRIPT", nargs="?", default=None,
                       help="the training script (default: the bundled reference target)")
    group.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                       help="arguments for the script")


def _add_parallel(sweeps: Any, output: Any) -> None:
    sweeps.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                        help="chaos runs at a time (default 1). Each run is a whole job"
                             " (NPROC x NODES processes): raise it where cores are left"
                             " over; runs that share cores are slower, and timing bounds"
                             " (lost seconds, hang detection) noisier")
    sweeps.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                        help="run only shard I of N of the planned runs (runs I, I+N, ...;"
                             " every shard makes or reuses the same reference): one per"
                             " machine, then `torchchaos merge` their --out folders into one"
                             " report. 'auto': I and N from a CI matrix"
                             " (TORCHCHAOS_SHARD_INDEX/COUNT), a Kubernetes Indexed Job"
                             " (JOB_COMPLETION_INDEX, TORCHCHAOS_SHARD_COUNT) or a Slurm"
                             " job array (SLURM_ARRAY_TASK_ID/COUNT)")
    _add_junit(output)


def _add_junit(group: Any) -> None:
    group.add_argument("--junitxml", type=Path, default=None, metavar="FILE",
                       help="also write JUnit XML: one test case per run (fail: a failure"
                            " naming the failing checks; could not judge: an error)")


def _add_fail_on(group: Any) -> None:
    group.add_argument(
        "--fail-on", type=_outcomes, default=frozenset(), metavar="OUTCOMES",
        help="a campaign measures, so it exits 0 whatever it found; name outcomes"
        " (comma-separated: masked, detected, silent divergence, crash, hang, not judged)"
        " and it exits 1 when a run ended in one, e.g. --fail-on 'silent divergence,hang'"
        " for a nightly that must go red")


def _outcomes(text: str) -> frozenset[str]:
    from torchchaos.explore.campaign import parse_outcomes

    try:
        return parse_outcomes(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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

    from torchchaos.version import __version__

    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "not installed"
    python = platform.python_version()
    return f"torchchaos {__version__} (torch {torch}, Python {python})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="torchchaos", description="Inject faults into a real torchrun"
                     " training job and judge its recovery against a fault-free reference.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    _add_run_command(sub)
    _add_battery_command(sub)
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
    groups = _groups(doctor, "job", "checks", "output")
    _add_optional_script(groups["job"])
    _add_job_options(groups)
    _add_crashpoints_command(sub)
    _add_campaign_command(sub)
    _add_exploration_commands(sub)
    nodes.add_commands(sub, _positive_int, _positive_seconds)
    cluster.add_commands(sub, _positive_int)
    docker.add_commands(sub)
    detectors.add_commands(sub)
    _add_export_command(sub)
    _add_incident_command(sub)
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
    _add_fail_on(merge)
    report = sub.add_parser("report", help="print the verdict table of a finished run")
    report.add_argument("out", type=Path, metavar="DIR", help="a --out directory of `run`")
    sub.add_parser("faults", help="list the fault kinds and their parameters")
    clean = sub.add_parser(
        "clean", help="list (or, with --yes, remove) what dead harnesses left behind",
        description="Finds what torchchaos runs left on this machine whose harness is dead"
        " (killed by SIGKILL, the OOM killer or a CI timeout, and its watcher too):"
        " processes carrying a run's mark, network namespaces, veth links and bridges of"
        " simulated nodes, fault filesystem mounts, an OOM fault's memory cgroups, a deep run's"
        " short TMPDIR link, a Slurm cluster a harness started (its daemons, its jobs' tasks,"
        " its folder), a Docker engine a harness started (its daemons, its containers'"
        " processes, layers, cgroups and folder), and dead harnesses' lock files. Lists"
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


def _add_incident_command(sub: Any) -> None:
    incident = sub.add_parser(
        "incident", help="turn what a failed job left into a scenario that replays it",
        description="Incident postmortems: `torchchaos incident import` reads what a"
        " failed job left and writes a scenario file that `torchchaos replay` runs and"
        " pytest collects.")
    actions = incident.add_subparsers(dest="incident_command", parser_class=_Parser)
    imp = actions.add_parser(
        "import", help="read a failed job's artefacts and write an incident file",
        description="Reads every named file and folder (launcher logs, torchelastic error"
        " files, gloo/NCCL errors, flight-recorder dumps, py-spy and faulthandler stacks,"
        " dmesg OOM lines, the training log, kubectl's pod JSON, a PyTorchJob, sacct,"
        " the checkpoint folder, a torchchaos report.json), tells which fault started the"
        " incident, on which rank, in which phase, with the rule and the lines for each,"
        " and writes it as a *.chaos.yaml file with the faults that replay it on --script."
        " Formats are told by content. Exit 2, writing nothing, when a file cannot be read.")
    imp.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                     help="artefact files and folders")
    imp.add_argument("-o", "--out", type=Path, default=Path("incident.chaos.yaml"),
                     metavar="FILE", help="the incident file to write (a new file; default"
                     " ./incident.chaos.yaml; name it *.chaos.yaml for pytest to collect it)")
    imp.add_argument("--script", type=Path, default=None, metavar="SCRIPT",
                     help="the training script to replay on (default: the one the artefacts"
                     " name, with their arguments, where it is on this machine; else the"
                     " bundled target); on the script the incident came from, the incident's"
                     " own steps place the faults, on another its fault-free reference run"
                     " does")
    imp.add_argument("--args", default=None, metavar="'ARGS'",
                     help="the script's arguments, as one quoted string")
    imp.add_argument("--nproc", type=_positive_int, default=None, metavar="N",
                     help="ranks to replay on (default: 2)")
    imp.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                     help="where fault-free reference runs are cached")
    imp.add_argument("--quiet", action="store_true", help="no progress lines")


def _add_run_command(sub: Any) -> None:
    run = sub.add_parser("run", help="run a chaos scenario against a training script",
                         epilog=run_epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = _groups(run, "job", "faults", "checks", "output")
    groups["job"].add_argument("script", metavar="SCRIPT",
                               help="the training script (run under torchrun)")
    groups["job"].add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                               help="arguments for the script")
    groups["faults"].add_argument("--fault", action="append", default=[], metavar="SPEC",
                                  help="a fault to inject (repeatable; see below)")
    _add_job_options(groups)


def _add_battery_command(sub: Any) -> None:
    battery = sub.add_parser(
        "battery", help="run the standard kill battery and print one verdict table",
        description=textwrap.fill(
            "Kill each rank mid-interval, a whole node, a rank inside a checkpoint save,"
            " tear its last write, cut the power after it, and preempt rank 0 with SIGTERM;"
            " one chaos run each, judged against one cached fault-free reference. The rows"
            " are placed from the reference run (--list shows them). With no SCRIPT, runs"
            " the bundled reference target (targets/ddp_lm.py --steps 20 --ckpt-every 5).",
            79),  # the epilog's layout is kept as written: this is wrapped here
        epilog=battery_epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = _groups(battery, "job", "sweeps", "checks", "output")
    _add_optional_script(groups["job"])
    sweeps = groups["sweeps"]
    sweeps.add_argument("--list", action="store_true",
                        help="print the rows (each one's name and fault) and exit, running"
                             " nothing: placed from the reference run where the cache holds"
                             " it, else with ? for what the reference run places")
    sweeps.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                        help="only the rows whose names match EXPR, as pytest's -k: words"
                             " (substrings, any case) with and, or, not and parentheses,"
                             " e.g. 'kill and not node'")
    sweeps.add_argument("-x", "--exitfirst", action="store_true",
                        help="stop at the first row whose verdict is not PASS: the table"
                             " and pages of the rows that finished")
    _add_parallel(sweeps, groups["output"])
    _add_job_options(groups, seed="seed for symbolic fault targets and p= triggers")


def _add_crashpoints_command(sub: Any) -> None:
    points = sub.add_parser(
        "crashpoints", help="judge every crash state of the checkpoint saves that differ",
        description="Runs the job once to the step after save --save (by default each save"
        " of a shape of its own: see --save) with the fault"
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
    groups = _groups(points, "job", "faults", "sweeps", "checks", "output")
    _add_optional_script(groups["job"])
    faults, sweeps = groups["faults"], groups["sweeps"]
    faults.add_argument("--save", type=_count, default=None, metavar="K",
                        help="which checkpoint save to enumerate (default: one save of each"
                             " shape the reference run shows, from save 2 on: the first that"
                             " creates, the first that replaces and the first that deletes"
                             " an earlier save's file; --per-point, --shard and"
                             " --record-only: save 2)")
    faults.add_argument("--mode", action="append", default=None, metavar="MODE",
                        help="kill, lose_unsynced, torn (repeatable; default all three);"
                             " with --per-point also stop (SIGSTOP: only the job's own"
                             " timeouts end the wait)")
    sweeps.add_argument("--cap", type=_count, default=None, metavar="N",
                        help="judge at most N crash states (--per-point: N points), sampled"
                             " with --seed (default: every state; 50 points)")
    sweeps.add_argument("--steps-after-resume", type=_positive_int, default=3, metavar="N",
                        help="end each point N steps after its recovery: the restore and"
                             " the first steps after it are what a crash point tests"
                             " (default 3; 0 runs every point to the last step)")
    sweeps.add_argument("--from-scratch", action="store_true",
                        help="start every point at step 0 instead of from a snapshot of the"
                             " checkpoints before the save under test (the reference run"
                             " takes it; --per-point only)")
    sweeps.add_argument("--per-point", action="store_true",
                        help="one whole chaos run per file event and mode, crashing the job"
                             " for real (slower: no recording, no shared recoveries)")
    sweeps.add_argument("--record-only", action="store_true",
                        help="make the reference and the recording of save --save in the"
                             " cache, judge nothing: then hand the --cache-dir to every"
                             " --shard (shards must judge one recording; two recordings of"
                             " one save differ in temporary names and interleavings)")
    _add_parallel(sweeps, groups["output"])
    _add_job_options(groups, seed="seed for the sample of --cap, symbolic fault targets"
                                  " and p= triggers")


def _add_campaign_command(sub: Any) -> None:
    campaign = sub.add_parser(
        "campaign", help="N seeded bit flips, one run each, and the outcome table",
        description="Each run flips one bit (a seeded element of a seeded tensor kind, bit"
        " class, rank and step) and is classified as masked, detected, silent divergence,"
        " crash or hang; the table counts them by bit class and tensor kind, and"
        " campaign.json keeps every run's details. With no SCRIPT, runs the bundled"
        " reference target without its defences (--no-sdc-defences); pass the target and"
        " its flags to measure a defended one. Exit 0 once every run was judged.")
    groups = _groups(campaign, "job", "faults", "sweeps", "checks", "output")
    _add_optional_script(groups["job"])
    faults = groups["faults"]
    faults.add_argument("--tensor", action="append", default=None, metavar="KIND",
                        help="param, grad, optim, activation (repeatable; default all)")
    faults.add_argument("--bit", action="append", default=None, metavar="CLASS",
                        help="sign, exp_high, exp_low, mant_high, mant_low (repeatable;"
                             " default all)")
    groups["sweeps"].add_argument("--runs", type=_count, default=20, metavar="N",
                                  help="how many flips (default 20)")
    _add_parallel(groups["sweeps"], groups["output"])
    _add_fail_on(groups["output"])
    _add_job_options(groups, seed="seed for the flips: tensor kind, bit class, rank, step"
                                  " and element of each")


def _add_exploration_commands(sub: Any) -> None:
    """replay, search and shrink: reproduce a run, find a breaking schedule, minimise one."""
    replay = sub.add_parser(
        "replay", help="run a scenario file again (a run's replay.yaml, or an incident)",
        description="Runs the scenario a file describes: every run writes one as"
        " OUT/replay.yaml (its resolved schedule and the verdict it came to), and incident"
        " postmortems in suites/incidents/ use the same format. Exit status as for `run`;"
        " the last line says whether the outcome is the one the file expects. A SCRIPT"
        " after the file points the scenario at another training script.")
    groups = _groups(replay, "job", "output")
    groups["job"].add_argument("file", type=Path, metavar="FILE",
                               help="a scenario file (YAML/JSON)")
    _add_optional_script(groups["job"])
    _add_run_dirs(groups["output"])
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
    groups = _groups(search, "job", "faults", "sweeps", "checks", "output")
    _add_optional_script(groups["job"])
    faults, sweeps = groups["faults"], groups["sweeps"]
    faults.add_argument("--kind", action="append", default=None, metavar="KIND",
                        help="kill, preempt, node_kill, save_kill, power_loss, bitflip, hang"
                             " (repeatable; default kill, preempt, save_kill)")
    faults.add_argument("--max-faults", type=_count, default=3, metavar="N",
                        help="faults per schedule at most (default 3)")
    faults.add_argument("--every-step", action="store_true",
                        help="faults at any step, not one per checkpoint interval")
    sweeps.add_argument("--examples", type=_count, default=20, metavar="N",
                        help="schedules Hypothesis draws before it gives up (default 20)")
    _add_search_options(sweeps)
    sweeps.add_argument("--shrink-runs", type=_positive_int, default=10, metavar="N",
                        help="runs Hypothesis may spend shrinking the first failure to"
                             " simpler ranks and steps, before delta debugging drops the"
                             " faults it does not need (default 10; 0: delta debugging only)")
    sweeps.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                        help="one of N searches with seeds of their own, each drawing its"
                             " share of --examples (one per machine); `torchchaos merge`"
                             " their --out folders for the smallest failing schedule of all."
                             " 'auto': I and N from the environment, as for battery")
    _add_job_options(groups, seed="seed of the search (Hypothesis), of symbolic fault"
                                  " targets and of p= triggers")
    shrink = sub.add_parser(
        "shrink", help="drop every fault a failing scenario file does not need",
        description="Delta debugging over the faults of a scenario file whose run failed"
        " (a run's replay.yaml): the result still fails, and dropping any one of its"
        " faults makes it pass. Saved as OUT/minimal.yaml. Exit 1 with the minimal"
        " schedule, 2 when the file's schedule does not fail to begin with.")
    groups = _groups(shrink, "job", "sweeps", "output")
    groups["job"].add_argument("file", type=Path, metavar="FILE",
                               help="a scenario file (YAML/JSON)")
    _add_search_options(groups["sweeps"])
    _add_run_dirs(groups["output"])


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
    cluster = export.add_argument_group("cluster", "the job's pods as Chaos Mesh selects them")
    cluster.add_argument("--namespace", default="default", metavar="NS",
                         help="the job's Kubernetes namespace (default default)")
    cluster.add_argument("--node-label", default=chaosmesh.DEFAULT_NODE_LABEL, metavar="KEY",
                         help="the pod label whose value is the node index (default"
                              f" {chaosmesh.DEFAULT_NODE_LABEL}; e.g."
                              " training.kubeflow.org/replica-index)")
    cluster.add_argument("--pod-per-rank", action="store_true",
                         help="every rank runs in a pod of its own, labelled with its global"
                              " rank: rank faults map to pods too")
    cluster.add_argument("--volume-path", default=chaosmesh.DEFAULT_VOLUME_PATH,
                         metavar="PATH",
                         help="where the checkpoint volume is mounted in the pods (IOChaos;"
                              f" default {chaosmesh.DEFAULT_VOLUME_PATH})")
    timing = export.add_argument_group("timing", "when a step happens, in seconds")
    timing = timing.add_mutually_exclusive_group()
    timing.add_argument("--seconds-per-step", type=_positive_seconds, default=None,
                        metavar="S", help="a step takes S seconds (step N fires N*S after start)")
    timing.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                        help="time steps as a run of the job did (its history)")
    output = export.add_argument_group("output", GROUPS["output"])
    output.add_argument("--name", default=None, metavar="NAME",
                        help="prefix of the objects' names (default: from FILE's name)")
    output.add_argument("--bare", action="store_true",
                        help="the chaos objects alone, each annotated with its offset,"
                             " instead of the Workflow")
    output.add_argument("--out", type=Path, default=None, metavar="FILE.yaml",
                        help="write here instead of stdout")
    output.add_argument("--jobset", type=Path, default=None, metavar="DIR",
                        help="also write the job itself, runnable: DIR/reference.yaml (a"
                             " JobSet whose pods, one per node, run `torchchaos node` without"
                             " faults) and DIR/chaos.yaml (the same with the faults Chaos Mesh"
                             " cannot inject, node 0 judging with `torchchaos gather`, then"
                             " the Chaos Mesh Workflow). Pods are selected by the Indexed"
                             " Job's completion-index label unless --node-label is given")
    output.add_argument("--image", default="torchchaos:latest", metavar="IMAGE",
                        help="--jobset: the pods' image, with torchchaos and the script at"
                             " its path relative to here (default torchchaos:latest: this"
                             " repository's Dockerfile)")
    output.add_argument("--claim", default="torchchaos-shared", metavar="NAME",
                        help="--jobset: a ReadWriteMany PersistentVolumeClaim the pods share"
                             " at /shared (default torchchaos-shared)")


def _add_run_dirs(output: Any) -> None:
    output.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="new directory for the runs and report.json"
                             " (default ./torchchaos-runs/<time>-<id>)")
    output.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                        help="where fault-free reference runs are cached"
                             " (default $XDG_CACHE_HOME/torchchaos)")
    output.add_argument("--quiet", action="store_true", help="no progress lines")


def _add_search_options(sweeps: Any) -> None:
    sweeps.add_argument("--repeats", type=_positive_int, default=2, metavar="N",
                        help="runs of a failing schedule before its failure is trusted"
                             " (default 2)")
    sweeps.add_argument("--max-runs", type=_count, default=40, metavar="N",
                        help="chaos runs at most, repeats included (default 40)")


def _check_names() -> str:
    from torchchaos.judge.checks_by_name import BUILTIN, OPT_IN

    names = [name for name in BUILTIN if name not in OPT_IN]
    return (f"{', '.join(names)}; {', '.join(OPT_IN)} only when named; a plug-in's"
            " by its name")


def _add_job_options(groups: Groups, seed: str = "") -> None:
    """The options every command that runs the job takes, in its groups: `job`,
    `checks`, `output`, and --seed in `faults` where the command has it, else in
    `sweeps` (with `seed`, what the seed picks there), else in `job`."""
    job, checks = groups["job"], groups["checks"]
    # torchrun's own names are accepted too: a user's launch line carries over as it is
    job.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc",
                     type=_positive_int, default=2, metavar="N",
                     help="ranks per node (default 2)")
    job.add_argument("--nodes", "--nnodes", dest="nodes", type=_positive_int, default=1,
                     metavar="N", help="simulated nodes, one torchrun agent each (default 1)")
    job.add_argument("--min-nodes", type=_positive_int, default=None, metavar="N",
                     help="elastic job: torchrun may go on with N to --nodes nodes"
                          " (default: exactly --nodes)")
    job.add_argument("--network", choices=("auto", "netns", "docker", "host"), default="auto",
                     help="netns: each node in its own network namespace on a private bridge"
                          " (root; needed for partition faults); docker: each node a"
                          " container on that bridge, with a disk of its own (/local) that"
                          " dies with the node (root, Debian's docker.io); host: the nodes"
                          " share the"
                          " machine's loopback; auto (default): netns for 2+ nodes where"
                          " it can be made")
    job.add_argument("--link", action="append", default=[], metavar="PATH",
                     help="show PATH in every run directory under its own name (a symlink;"
                          " repeatable): files the script opens by a fixed relative name,"
                          " since each run starts in a new folder (nanoGPT: --link"
                          " configurator.py --link data)")
    job.add_argument("--timeout", type=float, default=300.0, metavar="SEC",
                     help="deadline for each run, reference and chaos (default 300)")
    job.add_argument("--max-restarts", type=_positive_int, default=3, metavar="N",
                     help="torchrun elastic restarts per launch (default 3)")
    job.add_argument("--max-relaunches", type=_positive_int, default=2, metavar="N",
                     help="times the whole job is requeued after it died (default 2)")
    job.add_argument("--force", action="store_true",
                     help="run even with more than 4 ranks (--nproc x --nodes) per core of"
                          " this machine")
    seeds = groups.get("faults") or groups.get("sweeps") or job
    seeds.add_argument("--seed", type=_positive_int, default=0, metavar="N",
                       help=seed or "seed for symbolic fault targets and p= triggers")
    checks.add_argument("--check", action="append", default=None, metavar="NAME",
                        help="only these checks (repeatable; default: every check but the"
                             f" opt-in ones): {_check_names()}")
    checks.add_argument("--max-lost-steps", type=_positive_int, default=None, metavar="N",
                        help="steps a failure may cost (default: the checkpoint interval"
                             " seen in the reference run)")
    checks.add_argument("--max-lost-seconds", type=float, default=None, metavar="S",
                        help="seconds a failure may cost (default: no bound)")
    checks.add_argument("--max-detect-steps", type=_positive_int, default=None, metavar="N",
                        help="steps a bit flip may go unnoticed for sdc_detected (default:"
                             " the checkpoint interval, else 10)")
    checks.add_argument("--hang-timeout", type=_positive_seconds, default=None, metavar="SEC",
                        help="the job is hung once no rank made progress for SEC seconds:"
                             " the harness then takes every rank's stacks and tears it down;"
                             " the target's own timeout or watchdog must fire before"
                             " (default 10, or 3x the longest the fault-free run went"
                             " without progress)")
    checks.add_argument("--reference-runs", type=int, default=1, choices=(1, 2),
                        help="2 also proves the target deterministic without faults")
    checks.add_argument("--full-fingerprints", action="store_true",
                        help="fingerprint every step of the chaos run in full (default: in"
                             " full for 5 steps after each start, load and fault, parameters,"
                             " learning rates and batch on the steps between)")
    checks.add_argument("--mtbf", type=float, default=3.0, metavar="HOURS",
                        help="mean time between failures for the report's Young/Daly"
                             " checkpoint interval (default 3: a large job's interruption"
                             " rate)")
    _add_run_dirs(groups["output"])
