"""Which launch each line belongs to: the job's logs by name (a relaunch's, a sibling
node's), each cut at its restarts, and which part of them holds the first failure."""

from __future__ import annotations

import re

from torchchaos.incident.evidence import BAD_DATA, ECHO, is_failure
from torchchaos.incident.observations import (
    Observation,
    worker_of,
)


def _segments(obs: list[Observation]) -> dict[int, int]:
    """Each line-sourced observation's launch: log files in name order (one per launch or
    requeue; the logs of one launch's nodes or ranks, node0.log and node1.log, together),
    each cut where its launcher restarted the workers or its scheduler requeued the job
    into the same file."""
    # a worker's own file (torchrun --log-dir: attempt_1/0/stdout.log) is no launch's
    # log: its attempt, from its path, places it, as an error file's does
    files = sorted({o.source.file for o in obs if o.source.line is not None and (
        o.what in ("step", "resume", "save", "restart") or "local_rank" in o.extra)
        and worker_of(o.source.file) is None}, key=launch_order)
    cuts = {f: _cuts(f, obs) for f in files}
    launches: dict[tuple[str, str], list[str]] = {}  # in the order of their first log
    for f in files:
        launches.setdefault((f.rpartition("/")[0], launch_of(f)), []).append(f)
    order, seg = {}, 0
    for siblings in launches.values():
        # each node's log cut at its own restarts: its n-th part is the launch's n-th
        attempts = max(len(cuts[f]) for f in siblings) + 1
        for f in siblings:
            for n in range(len(cuts[f]) + 1):
                order[(f, n)] = seg + n
        seg += attempts
    found = {}
    for i, o in enumerate(obs):
        if o.source.line is not None and o.source.file in cuts:
            before = sum(1 for c in cuts[o.source.file] if c < o.source.line)
            found[i] = order[(o.source.file, before)]
        elif o.attempt is not None and len(files) == 1:  # an error file's attempt_<n>
            found[i] = min(o.attempt, len(cuts[files[0]]))
        elif o.attempt:  # several logs (nodes, relaunches): which launch is not known,
            found[i] = AFTER_A_RESTART  # but a restart's error never opens the incident
    return found


# the segment of what came after some restart, in a launch not known
AFTER_A_RESTART = 1 << 30


def _cuts(file: str, obs: list[Observation]) -> list[int]:
    """Where a log moves to the next attempt: a restart line, or a worker failure after
    which the log shows training again (torchrun's restart lines are INFO, often unseen),
    or a scheduler's end of the job after which it does (Slurm requeues a job into the
    same output file)."""
    lines = [o for o in obs if o.source.file == file and o.source.line is not None]
    restarts = [o.source.line for o in lines if o.what == "restart"]
    # the launcher's "failed (exitcode ...)" lines, not the entries of its final summary
    failures = sorted(o.source.line for o in lines if o.what == "exit"
                      and "local_rank" in o.extra and "root_cause" not in o.extra
                      or o.what == "node_lost" or o.what == "job_state"
                      and o.reason != "finished")
    went_on = [n for n in failures if n != failures[-1] or any(
        o.what in ("step", "resume") and o.source.line > n for o in lines)]
    return sorted(set(restarts) | set(went_on))  # type: ignore[arg-type]


def restart_count(obs: list[Observation]) -> int:
    """How many times the workers were started again, by the most any artefact shows:
    the highest attempt of torchrun's folder per worker (attempt_1/), or the most one log
    shows (each node's agent tells each restart): its restart lines ("... attempts left",
    INFO and often not in the log), else its attempts cut at failures after which it
    trained again."""
    attempts = max((o.attempt for o in obs if o.attempt is not None), default=0)
    per_log = []
    for log in {o.source.file for o in obs if o.source.line is not None}:
        said = sum(1 for o in obs if o.what == "restart" and o.source.file == log
                   and "attempts left" in o.detail)
        per_log.append(said or len(_cuts(log, obs)))
    return max([attempts, *per_log])


def first_failure(obs: list[Observation], stopped: set[int | None]):
    """(what the rules look at: the launch where the first failure shows and everything
    not tied to a launch, what came after it)."""
    seg = _segments(obs)
    failing = [seg[i] for i, o in enumerate(obs) if i in seg and is_failure(o, stopped)]
    if not failing:
        return obs, []
    first = min(failing)
    now = [o for i, o in enumerate(obs) if seg.get(i, first) <= first]
    return now, [o for i, o in enumerate(obs) if seg.get(i, first) > first]


def vanished_launch(obs: list[Observation]) -> tuple[str, Observation] | None:
    """(a launch's log that ends with no failure and no success, what shows a later launch
    took over: a resume, a failure reading the checkpoint (in a load, or an error that
    says the data read was bad), or a log that went on past where the first one
    stopped), or None. Only a relaunch's log counts (`relaunch_of`: slurm-41.out,
    slurm-42.out): another log in the folder (a build's, a tool's) is no launch of the
    job."""
    logs = sorted({o.source.file for o in obs if o.what == "log_file"}, key=launch_order)
    took_over = [o for o in obs if o.what in ("resume", "no_checkpoint") or o.what == "error"
                 and (o.phase == "load" or BAD_DATA.search(o.detail) and o.phase != "data")
                 and not ECHO.search(o.detail)]
    for name in logs:
        if any(o.source.file == name and o.what in ("exit", "error", "restart", "resume")
               for o in obs) or _ended_as_meant(name, obs):
            continue
        after = [o for o in took_over if relaunch_of(name, o.source.file)] + \
            [o for o in obs if o.what == "log_file" and relaunch_of(name, o.source.file)
             and went_on_past(name, o, obs)]
        if after:
            return name, after[0]
    return None


def _ended_as_meant(log: str, obs: list[Observation]) -> bool:
    """Whether the log's last word, at or after its last step or save line, is that the
    run finished or that the scheduler ended it (a time limit, a cancel): a relaunch
    after it took over from no launch that vanished."""
    mine = [o for o in obs if o.source.file == log and o.source.line is not None]
    progress = max((o.source.line for o in mine if o.what in ("step", "save")), default=0)
    return any(o.what == "job_state" and o.source.line >= progress for o in mine)


def went_on_past(ended: str, later: Observation, obs: list[Observation]) -> bool:
    """Whether the later launch's log printed every kind of line the log `ended` did, and
    more, or every step line it did, word for word, and more (a script that prints only
    step lines past its start): it got past where that launch stopped. A run that
    finished, launched again from scratch, prints the same kinds of lines twice, and the
    same step lines; a log that printed nothing at all stopped before anything."""
    first = next((o for o in obs if o.what == "log_file" and o.source.file == ended), None)
    if first is None:
        return False
    stepped, again = first.extra.get("opening", ()), later.extra.get("opening", ())
    if stepped and again[:len(stepped)] == stepped \
            and later.extra.get("step_lines", 0) > first.extra.get("step_lines", 0):
        return True
    mine = first.extra.get("shapes", frozenset())  # an empty log has none
    theirs = later.extra.get("shapes")
    return mine is not None and bool(theirs) and mine < theirs  # None: too varied to tell


# what names one of several logs of one launch: a node's, a rank's (rank-1.log), a
# Kubeflow PyTorchJob worker pod's (gpt2-ddp-worker-1.log)
SIBLING = re.compile(r"(?<=node)[-_]?\d+|(?<=rank)[-_]?\d+|(?<=worker)[-_]?\d+", re.I)


# a Slurm array's task in sbatch's default name (slurm-%A_%a.out: slurm-41_3.out): the
# tasks of one array run side by side; a resubmitted array has another job id
ARRAY_TASK = re.compile(r"(?<=slurm-)(\d+)_\d+")


def relaunch_of(log: str, file: str) -> bool:
    """Whether `file` is a later launch's log of the job that wrote `log`: in its folder,
    after it, and named as it is, numbers aside (launch-0-node-0.log, launch-1-node-0.log),
    and not a sibling's (another node's, rank's or array task's of the same launch)."""
    return launch_order(file) > launch_order(log) and same_folder(log, file) and \
        re.sub(r"\d+", "#", log) == re.sub(r"\d+", "#", file) and \
        launch_of(log) != launch_of(file)


def launch_of(log: str) -> str:
    """The log's name with what tells siblings apart blanked out."""
    return ARRAY_TASK.sub(r"\1_#", SIBLING.sub("#", log))


def launch_order(name: str) -> tuple:
    """A log's place among the job's logs: by name, its numbers as numbers (run9.log
    before run10.log, slurm-9999.out before slurm-10000.out)."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", name)))


def same_folder(a: str, b: str) -> bool:
    return a.rpartition("/")[0] == b.rpartition("/")[0]


def restarted(later: list[Observation], obs: list[Observation]) -> bool:
    """Whether anything after the first failure is a restart's: a later part of one of its
    logs, a relaunch's log, or a later attempt's file. A log in another folder that is no
    relaunch (the script's own train.log beside the launcher's job.log) is another view of
    the same launch, not a restart."""
    if any(o.attempt for o in later):
        return True
    lined = {o.source.file for o in obs if o.source.line is not None}
    logs = lined | {o.source.file for o in obs if o.what == "log_file"}  # an empty one too
    after = {o.source.file for o in later if o.source.line is not None}  # each file once
    return any(file in lined or any(relaunch_of(log, file) for log in logs) for file in after)
