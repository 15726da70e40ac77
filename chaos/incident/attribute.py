"""Observations to an incident: what each rank did, which fault started it, in which phase.

Every conclusion names its rule and the lines it stands on. The rules, in the
order they are tried for the first failure (the first that applies wins):

1. **oom**: the kernel, Kubernetes (OOMKilled) or Slurm (OUT_OF_MEMORY) says a
   process was killed for memory; its pid gives the rank where the launcher
   named that pid.
2. **crash**: a rank died of a fatal signal of its own (SIGSEGV, SIGABRT,
   SIGBUS, SIGFPE, SIGILL), from its exit status or faulthandler's dump.
3. **abort**: a rank's collective found its process group gone mid-training
   (gloo's "Default process group has not been initialized" from inside a
   collective: aborted under the rank), or its teardown did (a rank that trained
   on through DDP's own handle, and whose `destroy_process_group` raised).
4. **exception**: a rank raised an error that is not the echo of another's
   failure (a peer that closed its connection, a collective timeout, a SIGTERM
   the launcher sent, torchrun's own ChildFailedError), nor a DataLoader
   worker's death (rule 4b).
5. **hang**: a collective timed out (gloo's receive timeout, NCCL's watchdog), or
   a watchdog took every rank's stack before the job was killed. The rank waited
   for is the one behind in the flight recorder, else the one whose stack is
   outside every collective, else, in a job of two ranks, the other one. A
   hung rank whose stack is in the data loader waited on a stopped worker.
   **4b. dataloader** (tried before the hang): a rank's error says one of its
   DataLoader workers died (torch's "DataLoader worker (pid N) is killed by
   signal" / "exited unexpectedly"), before any collective timed out in that log
   (after one, a stopped rank's workers died with it: the hang's aftermath).
6. **preempt**: a rank ended by SIGTERM (or exit 143) that the launcher did not
   send, or a scheduler says the job was preempted.
7. **kill**: a rank ended by SIGKILL that the launcher did not send.
8. **node**: a scheduler says the node failed, or a launcher's log ends with no
   failure and no success while a later launch resumed, failed reading the
   checkpoint, or printed every kind of line it did and went on past it: the node
   (its launcher and every rank on it) went down.
9. **torn_write** / **power_loss**: only the checkpoint folder shows it: a file
   that does not load.

The phase (`PHASE_RULES`, in order): none for an abort found only at the
rank's teardown (when it came is not told); the failing rank's own frames in a
save or a load; a temporary file in the checkpoint folder, or a file that does not load
(a save under way); the log (a save begun and not said done; a resume line
with no step after it: the load); where the surviving ranks waited; the
failing rank in a collective (a training step); else between saves, said as
placed by rule, not seen, where a step before it is known (a step line of its
own launch, or the save its restart resumed from, which the job had finished) or,
in a log with no step line, a save said done before it; unknown where none is.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from torchchaos.incident import frameworks, script_source
from torchchaos.incident.formats import checkpoints
from torchchaos.incident.formats.collectives import PEER_LOST
from torchchaos.incident.observations import (
    Observation,
    Source,
    function_of,
    phase_of_frames,
    telling_frame,
    worker_of,
)

KINDS = ("oom", "crash", "dataloader", "abort", "exception", "hang", "preempt", "kill", "node",
         "torn_write", "power_loss", "unknown")
PHASES = ("startup", "between_saves", "mid_save", "load", "after_resume", "exit", "unknown")
FATAL = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL")
# An error that reports another rank's failure, not one of its own. The last line is
# torchchaos's own hang fault releasing a held rank when its peer exits.
ECHO = re.compile(PEER_LOST.pattern + r"|Timed out waiting|Watchdog caught|"
                  r"Application timeout caused pair closure|"
                  r"exited while this rank was in|"
                  r"Signal \d+ \(SIG\w+\) received|ChildFailedError|ProcessExitedException|"
                  r"SignalException|KeyboardInterrupt|NCCL communicator was aborted|"
                  r"DistBackendError|DistNetworkError|ncclRemoteError|the remote worker|"
                  # DCP's wrapper of the failed ranks' own errors, which it relays after it
                  r"CheckpointException ranks:",
                  re.I)
# a word of a line that may be a path: "ckpt/checkpoint-10", '/runs/model.pt' (its last
# part is matched against the checkpoint folder's files and folders)
PATH_WORD = re.compile(r"[^\s'\"(),;]+")
# how a hang reads where the rank waited in its data loader (mapping replays it so)
LOADER_WAIT = "waiting for a batch from its DataLoader worker"
LOAD_ERROR = re.compile(r"PytorchStreamReader|central directory|Ran out of input|"
                        r"invalid load key|unpickling|checksum|sha256|corrupt|truncated|"
                        r"safetensors|UnpicklingError|EOFError", re.I)


def _a_load_error(e: Observation) -> bool:
    """An error raised loading a checkpoint: in a load's frames, or with a message a
    checkpoint that does not load raises, unless its frames are the data pipeline's (a
    truncated image, a corrupt sample)."""
    return e.phase == "load" or bool(LOAD_ERROR.search(e.detail)) and e.phase != "data"


# A restart's error that says the checkpoint it read is bad or not there: a file that
# does not load, a missing file or key, a state that does not fit the model
BAD_DATA = re.compile(LOAD_ERROR.pattern + r"|FileNotFoundError|No such file|KeyError|"
                      r"Missing key|Unexpected key|size mismatch|JSONDecodeError|"
                      r"valid checkpoint", re.I)  # the Trainer: "Can't find a valid checkpoint"


@dataclass
class RankStory:
    """One rank as the artefacts tell it."""

    rank: int
    last_step: int | None = None
    end: str = ""              # "SIGKILL", "exit 1", "stopped by the launcher", "OOM-killed"
    error: str = ""            # its own last error line
    frame: str = ""            # where it was: the innermost frame that says
    phase: str | None = None   # what that frame says (save, load, collective, ...)
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, "", [])}


@dataclass
class Finding:
    """The fault the artefacts point to."""

    kind: str = "unknown"
    rank: int | None = None
    node: int | None = None
    role: str = "unknown"       # writer | other | node | job | unknown
    phase: str = "unknown"
    phase_seen: bool = False    # False: placed by rule, not seen in a frame or a file
    # mid_save seen as a peer waiting inside a save of its own (every rank takes part in
    # the save): the failing rank was deep enough in it that the others had joined
    peers_in_save: bool = False
    how: str = ""               # SIGKILL, SIGTERM, SIGSEGV, "RuntimeError: ...", OOM
    collective: str | None = None
    step_window: tuple[int | None, int | None] = (None, None)
    # which save of its launch (1st, 2nd, ...) a death mid-save fell in, where the rule
    # that placed it names that save's step and the steps between saves are known
    save: int | None = None
    # other kinds the same artefacts fit, said rather than chosen between, and why
    alternatives: list[str] = field(default_factory=list)
    alternatives_why: str = ""
    rules: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        found = {k: v for k, v in self.__dict__.items() if v not in (None, "", [])}
        found["step_window"] = list(self.step_window)
        return found


@dataclass
class RestartFailure:
    """The restart's own failure, where the restart after the first failure failed too."""

    rank: int | None
    phase: str      # load | mid_save | after_resume | unknown
    how: str        # its error, first sentence
    source: str
    # the error says the checkpoint it read is bad or missing (a file that does not
    # load, a key or file not there): the script's own doing after the first failure,
    # which a replay of that failure reproduces; else a fault of its own (an I/O error,
    # a timeout, any other exception raised while the data was fine)
    bad_data: bool = False
    role: str = "unknown"   # writer | other, as the first failure's rank is told

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Incident:
    finding: Finding
    ranks: dict[int, RankStory]
    restarts: int = 0
    resumed: list[str] = field(default_factory=list)   # what the logs say it resumed from
    checkpoints: list[str] = field(default_factory=list)  # checkpoint files that do not load
    unknowns: list[str] = field(default_factory=list)
    script: str | None = None
    world_size: int | None = None
    recovery: str = "not seen"  # what the restart after the first failure did
    restart_failure: RestartFailure | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"finding": self.finding.to_dict(),
                "ranks": {str(r): s.to_dict() for r, s in sorted(self.ranks.items())},
                "restarts": self.restarts, "resumed": self.resumed,
                "checkpoints": self.checkpoints, "unknowns": self.unknowns,
                "recovery": self.recovery,
                **({"restart_failure": self.restart_failure.to_dict()}
                   if self.restart_failure else {}),
                **({"world_size": self.world_size} if self.world_size else {})}


def attribute(observations: list[Observation],
              sources: dict[str, list[str]] | None = None) -> Incident:
    """The incident `observations` tell; `sources` (the script files their tracebacks
    quote, from `gather`) let a silent script's peers say where its failure fell."""
    everything = _resume_steps(_started_over(_with_ranks(observations)))
    stopped = {o.pid for o in everything if o.reason == "stopped by the launcher" and o.pid}
    obs, later = _first_failure(everything, stopped)
    obs = _complete_pids(obs)
    ranks = _stories(obs, stopped)
    for rank in {o.rank for o in everything if o.rank is not None} - set(ranks):
        ranks[rank] = RankStory(rank)  # seen only later: still a rank of the job
    finding = Finding()
    for rule in (_oom, _crash, _abort, _exception, _dataloader, _node_said, _hang,
                 _limit_ended_hang, _preempt,
                 _kill, _silent_peer, _node, _failed_without_a_traceback, _checkpoint_only):
        if rule(obs, stopped, ranks, finding):
            break
    incident = Incident(finding, ranks)
    ended = next((src[:-4] for src in finding.sources if src.endswith(":end")), None)
    if ended is not None:  # a launch that vanished: what came after is the next launch's
        later = [o for o in everything if _order(o.source.file) > _order(ended)
                 and _same_folder(o.source.file, ended)]
    incident.recovery, incident.restart_failure = _recovery(later, stopped)
    incident.restarts = _restarts(everything)
    incident.resumed = [f"{o.detail} ({o.source})" for o in everything if o.what == "resume"]
    incident.checkpoints = [f"{o.source}: {o.detail}" for o in everything
                            if o.what == "checkpoint"
                            and (o.extra.get("loads") is False or o.extra.get("temp"))]
    incident.world_size = max(ranks) + 1 if ranks else None
    incident.script = _script(obs)
    _place(obs, incident, later, sources or {})
    return incident


# -- which part of the logs is the first failure ----------------------------------------

def _segments(obs: list[Observation]) -> dict[int, int]:
    """Each line-sourced observation's launch: log files in name order (one per launch or
    requeue; the logs of one launch's nodes or ranks, node0.log and node1.log, together),
    each cut where its launcher restarted the workers or its scheduler requeued the job
    into the same file."""
    # a worker's own file (torchrun --log-dir: attempt_1/0/stdout.log) is no launch's
    # log: its attempt, from its path, places it, as an error file's does
    files = sorted({o.source.file for o in obs if o.source.line is not None and (
        o.what in ("step", "resume", "save", "restart") or "local_rank" in o.extra)
        and worker_of(o.source.file) is None}, key=_order)
    cuts = {f: _cuts(f, obs) for f in files}
    launches: dict[tuple[str, str], list[str]] = {}  # in the order of their first log
    for f in files:
        launches.setdefault((f.rpartition("/")[0], _launch_of(f)), []).append(f)
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


def _restarts(obs: list[Observation]) -> int:
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


def _is_failure(o: Observation, stopped: set[int | None]) -> bool:
    if o.what in ("collective_timeout", "peer_lost", "oom_kill", "node_lost"):
        return True
    if o.what == "exit":
        return o.reason != "stopped by the launcher" and o.pid not in stopped and \
            (o.signal is not None or bool(o.exitcode))
    return o.what == "error" and not ECHO.search(o.detail) and not _deliberate_exit(o)


def _deliberate_exit(o: Observation) -> bool:
    """A SystemExit's traceback (a SIGTERM handler's `sys.exit(143)` that landed in an
    atexit callback, which Python prints as "Exception ignored"): no error of the rank's,
    whose exit status the launcher tells."""
    return o.detail.startswith("SystemExit")


def _first_failure(obs: list[Observation], stopped: set[int | None]):
    """(what the rules look at: the launch where the first failure shows and everything
    not tied to a launch, what came after it)."""
    seg = _segments(obs)
    failing = [seg[i] for i, o in enumerate(obs) if i in seg and _is_failure(o, stopped)]
    if not failing:
        return obs, []
    first = min(failing)
    now = [o for i, o in enumerate(obs) if seg.get(i, first) <= first]
    return now, [o for i, o in enumerate(obs) if seg.get(i, first) > first]


def _first_sentence(text: str, limit: int = 160) -> str:
    end = text.find(". ", 40)
    cut = text[:end + 1] if 0 < end < limit else text[:limit]
    return cut + ("..." if len(cut) < len(text) and not cut.endswith(".") else "")


def _recovery(later: list[Observation],
              stopped: set[int | None]) -> tuple[str, RestartFailure | None]:
    # the first error the log printed (the launcher's summary repeats one, later)
    errors = sorted(_own_errors(later), key=lambda o: (_order(o.source.file),
                                                        o.source.line or 1e9))
    resumed = [o for o in later if o.what == "resume"]
    if errors:
        e = errors[0]
        loading = _a_load_error(e)
        # past the load only where its frames say it trained on: an error no frame places
        # is not known to have come after the resume
        phase = "load" if loading else "mid_save" if e.phase == "save" else \
            "after_resume" if e.phase in ("collective", "data", "step") else "unknown"
        rank = e.rank if e.rank is not None else _rank_of_untagged(e, later, stopped)
        failure = RestartFailure(rank, phase, _first_sentence(e.detail), str(e.source),
                                 bad_data=bool(BAD_DATA.search(e.detail)))
        where = " while loading a checkpoint" if loading else ""
        return f"failed{where}: {failure.how} ({e.source})", failure
    if resumed:
        return f"resumed: {resumed[0].detail[:120]} ({resumed[0].source})", None
    nothing = [o for o in later if o.what == "no_checkpoint"]
    if nothing:
        return f"restarted from scratch: {nothing[0].detail[:120]} ({nothing[0].source})", \
            None
    if later:
        return "restarted; no resume line in the logs", None
    return "not seen", None


def _rank_of_untagged(error: Observation, obs: list[Observation],
                      stopped: set[int | None]) -> int | None:
    """The rank of an error printed with no rank tag (a library's own logger: DCP's
    "Global metadata is not found" and its traceback): the one rank whose error lines
    quote its message, else the one rank the launcher saw fail; None where not one."""
    message = error.detail.partition(": ")[2].strip()
    quoting = {o.rank for o in obs if o.what == "error" and o.rank is not None
               and len(message) > 12 and message in o.detail}
    if len(quoting) == 1:
        return quoting.pop()
    failed = {o.rank for o in obs if o.rank is not None and _is_failure(o, stopped)
              and o.what == "exit"}
    return failed.pop() if len(failed) == 1 else None


# -- who is who ---------------------------------------------------------------------------

def _with_ranks(observations: list[Observation]) -> list[Observation]:
    """Observations that name a pid the launcher tied to a rank get that rank."""
    observations = _local_ranks_unknown(observations)
    pid_rank = {o.pid: o.rank for o in observations if o.pid and o.rank is not None}
    return [dataclasses.replace(o, rank=pid_rank[o.pid]) if o.rank is None and o.pid in pid_rank
            else o for o in observations]


def _local_ranks_unknown(obs: list[Observation]) -> list[Observation]:
    """A launcher's "failed ... local_rank: 0" line in one of several nodes' logs
    (node0.log, node1.log) with no summary entry that gives its global rank: which global
    rank that is depends on the order the nodes joined, which no log says. Its rank is
    not known (a pid or a tagged line may still tell it)."""
    logs = {o.source.file for o in obs if o.what == "log_file"}
    several = {f for f in logs if any(g != f and _same_folder(f, g)
                                      and _launch_of(g) == _launch_of(f) for g in logs)}
    return [dataclasses.replace(o, rank=None) if o.what == "exit" and "local_rank" in o.extra
            and "root_cause" not in o.extra and not o.extra.get("global")
            and o.source.file in several else o for o in obs]


def _started_over(obs: list[Observation]) -> list[Observation]:
    """`obs`, and a `no_checkpoint` for each relaunch that started over without saying
    so: its log begins with every step line an earlier launch of the job printed, word
    for word (wall-clock times aside), and went on past where that launch stopped. A
    relaunch that resumed prints later steps first; two runs that both finished print
    the same kinds of lines, and neither went on past the other."""
    logs = [o for o in obs if o.what == "log_file" and o.extra.get("opening")]
    told = {o.source.file for o in obs if o.what in ("resume", "no_checkpoint")}
    found = []
    for first in logs:
        mine = first.extra["opening"]
        if first.source.file in told:
            continue  # a launch that resumed itself: not a fresh start to compare with
        for later in logs:
            theirs = later.extra["opening"]
            if later.source.file in told or not _relaunch_of(first.source.file,
                                                              later.source.file) \
                    or theirs[:len(mine)] != mine or not _went_on_past(first.source.file,
                                                                       later, obs):
                continue
            line = min((o.source.line for o in obs if o.source.file == later.source.file
                        and o.what in ("step", "save") and o.source.line is not None),
                       default=None)
            found.append(Observation(
                "no_checkpoint", Source(later.source.file, line),
                detail=f"its step (or save) lines begin as {first.source.file}'s did, word"
                       f" for word ({mine[0][:80]!r}): it started over, from no checkpoint",
                extra={"started_over": True}))
            told.add(later.source.file)
    return obs + found


def _resume_steps(obs: list[Observation]) -> list[Observation]:
    """A resume line that names a checkpoint but no step ("resumed from ckpt/checkpoint-10")
    takes the step the checkpoint folder gives that file or folder, where exactly one
    does."""
    steps: dict[str, set[int]] = {}
    for o in obs:
        if o.what == "checkpoint" and o.step is not None:
            # the file, or its folder, whichever calls its number a step ("step-0015.pt",
            # "checkpoint-10/"): not "epoch_3.pt" or "resnet50.pt", whose number is
            # another's, nor the "ckpt/" every save sits in
            for part in o.source.file.split("/")[-2:]:
                named = checkpoints.NAMED_STEP.search(part) or \
                    checkpoints.STEP_FOLDER.search(part)
                if named and int(named.group(1)) == o.step:
                    steps.setdefault(part, set()).add(o.step)

    def named(o: Observation) -> int | None:
        found = {step for word in PATH_WORD.findall(o.detail)
                 for step in steps.get(word.rstrip("/.:").rsplit("/", 1)[-1], ())}
        return found.pop() if len(found) == 1 else None

    return [dataclasses.replace(o, step=step) if o.what == "resume" and o.step is None
            and (step := named(o)) is not None else o for o in obs]


def _complete_pids(obs: list[Observation]) -> list[Observation]:
    """One launch's workers are its local ranks 0..n-1: where the launcher names n pids
    and n-1 of them are tied to a rank, the last pid is the missing rank."""
    pids = {o.pid for o in obs if o.what == "exit" and o.pid and o.source.line is not None
            and "root_cause" not in o.extra}
    known = {o.pid: o.rank for o in obs if o.pid in pids and o.rank is not None}
    loose = pids - set(known)
    missing = set(range(len(pids))) - set(known.values())
    if len(loose) != 1 or len(missing) != 1:
        return obs
    pid, rank = loose.pop(), missing.pop()
    return [dataclasses.replace(o, rank=rank, extra={**o.extra, "rank_by": "the launcher's"
                                                     " other worker"})
            if o.pid == pid and o.rank is None else o for o in obs]


def _stories(obs: list[Observation], stopped: set[int | None]) -> dict[int, RankStory]:
    ranks: dict[int, RankStory] = {}
    for o in obs:
        if o.rank is None or o.what in ("checkpoint", "injected", "job_state"):
            continue
        story = ranks.setdefault(o.rank, RankStory(o.rank))
        if o.what == "step" and o.step is not None:
            story.last_step = max(story.last_step or 0, o.step)
        elif o.what == "exit" and not story.end:
            story.end = "stopped by the launcher" if o.pid in stopped and o.signal == "SIGTERM" \
                else o.signal or (f"exit {o.exitcode}" if o.exitcode is not None else "")
            story.sources.append(str(o.source))
        elif o.what == "oom_kill":
            story.end = "OOM-killed"
            story.sources.append(str(o.source))
        if o.what in ("error", "exit") and o.detail and not ECHO.search(o.detail) \
                and not story.error and not o.detail.startswith("faulthandler"):
            story.error = o.detail[:200]
        if o.frames and (not story.frame or o.what == "stack"):
            # the frame that tells the phase names where the rank was; the innermost one
            # may be a wrapper's (the code that raised, a hook)
            told = telling_frame(o.frames)
            story.frame = told[0] if told else o.frames[-1]
            story.phase = o.phase or story.phase
    return ranks


def _own_errors(obs: list[Observation]) -> list[Observation]:
    return [o for o in obs if o.what in ("error", "exit") and o.detail
            and not ECHO.search(o.detail) and not o.detail.startswith(("faulthandler", "Signal"))
            and not _deliberate_exit(o) and ":" in o.detail
            and o.reason != "stopped by the launcher" and not _survived(o, obs)]


def _survived(error: Observation, obs: list[Observation]) -> bool:
    """A traceback the script printed and went on from (a bad sample it logged and
    skipped): its log says the run finished after it, with no launcher's word of a failed
    worker between."""
    if error.what != "error" or error.source.line is None:
        return False
    after = [o for o in obs if o.source.file == error.source.file
             and (o.source.line or 0) > error.source.line]
    finished = min((o.source.line for o in after if o.what == "job_state"
                    and o.reason == "finished"), default=None)
    return finished is not None and not any(
        o.what == "exit" and "local_rank" in o.extra and o.source.line < finished for o in after)


def _say(finding: Finding, rule: str, *sources: Observation) -> None:
    finding.rules.append(rule)
    finding.sources += [str(o.source) for o in sources if str(o.source) not in finding.sources]


# -- the rules, in order ------------------------------------------------------------------

# An allocation that failed, as torch, CUDA and Python say it (raised, not killed)
ALLOCATION_FAILED = re.compile(r"OutOfMemoryError|CUDA out of memory|can't allocate memory"
                               r"|^MemoryError\b")


def _oom(obs, stopped, ranks, f: Finding) -> bool:
    kills = [o for o in obs if o.what == "oom_kill"]
    if not kills:
        return _allocation_failed(obs, f)
    first = next((o for o in kills if o.rank is not None), kills[0])
    f.kind, f.rank, f.how = "oom", first.rank, "OOM"
    f.node = first.extra.get("node")
    who = f"rank {first.rank}" if first.rank is not None else \
        f"pid {first.pid}" if first.pid else "a process"
    _say(f, f"oom: {first.reason or 'the OOM killer'} killed {who} ({first.source})", first)
    if first.rank is None:
        silent = _silent_ranks(obs, ranks)
        if len(silent) == 1 and first.pid and first.pid not in {o.pid for o in obs if o.rank
                                                                 is not None}:
            f.rank = silent[0]
            f.rules.append(f"no launcher line names pid {first.pid}, and rank {f.rank} is the"
                           " only rank with no word in the logs while a peer saw its"
                           " connection close: the process the OOM killer took was rank"
                           f" {f.rank}")
        else:
            f.rules.append(f"no launcher line names pid {first.pid}: the rank is not known")
    return True


def _allocation_failed(obs: list[Observation], f: Finding) -> bool:
    failed = [o for o in _own_errors(obs) if ALLOCATION_FAILED.search(o.detail)]
    if not failed:
        return False
    first = next((o for o in failed if o.rank is not None), failed[0])
    f.kind, f.rank, f.how = "oom", first.rank, f"allocation failed: {first.detail[:140]}"
    _say(f, f"oom: an allocation failed ({first.source})", first)
    return True


def _crash(obs, stopped, ranks, f: Finding) -> bool:
    # NCCL's watchdog aborts a rank whose collective timed out, or whose peer it saw exit
    # ("ncclRemoteError: ... a remote process exiting prematurely"): that SIGABRT is the
    # hang's, or the peer's death's, echo
    echoes = [o for o in obs if o.what in ("collective_timeout", "peer_lost")]
    echoed = {o.rank for o in echoes if o.rank is not None}
    # a node's launcher line gives only the local rank: an echo in the same log will do
    echoed_in = {o.source.file for o in echoes}
    fatal = [o for o in obs if o.what == "exit" and o.signal in FATAL and o.pid not in stopped
             and not (o.signal == "SIGABRT" and (o.rank in echoed or o.rank is None
                                                 and o.source.file in echoed_in))
             and not _in_a_loader_worker(o)]
    if not fatal:
        return False
    first = next((o for o in fatal if o.rank is not None), fatal[0])
    f.kind, f.rank, f.how = "crash", first.rank, first.signal or ""
    _say(f, f"crash: {_who(first)} died of {first.signal} ({first.source})", first)
    if first.rank is None and "local_rank" in first.extra:
        _rank_of_a_local_death(obs, ranks, f)
    elif first.rank is None:
        # an untagged faulthandler dump: a rank that died of it said nothing else
        silent = _silent_ranks(obs, ranks)
        if len(silent) == 1:
            f.rank = silent[0]
            f.rules.append(f"the dump names no rank, and rank {f.rank} is the only rank with"
                           " no word of its own while a peer saw its connection close:"
                           f" the dump is rank {f.rank}'s")
        else:
            f.rules.append("the dump names no rank, and the rank is not known")
    return True


WORKER_DIED = re.compile(r"DataLoader worker \(pids?\(?s?\)? ?([\d, ]+)\) (is killed by signal:"
                         r" ?([^.]+)|exited unexpectedly)")
# gloo's word for a group aborted under the rank (NCCL's "communicator was aborted" is
# also what its watchdog leaves after a timeout: a hang's echo, left to the hang rule)
GROUP_GONE = re.compile(r"Default process group has not been initialized|"
                        # the functional collectives' (DTensor, FSDP2) word for it
                        r"Could not resolve the process group registered under the name")


def _dataloader(obs, stopped, ranks, f: Finding) -> bool:
    died = [o for o in _own_errors(obs) if WORKER_DIED.search(o.detail)]
    if not died:
        return False
    # a worker "killed by signal: Terminated" is the launcher's SIGTERM reaching the
    # workers of a rank it stops: an echo, where another worker died first
    killed = [o for o in died if "Terminated" not in o.detail] or died
    killed.sort(key=lambda o: (_order(o.source.file), o.source.line or 0))
    first = next((o for o in killed if o.rank is not None), killed[0])
    if any(t.what == "collective_timeout" and t.source.file == first.source.file
           and (t.source.line or 0) < (first.source.line or 0) for t in obs):
        # a collective timed out first: a hang, whose stopped rank's workers died with it
        # (a worker killed first makes its rank fail, and a peer may time out after it)
        return False
    m = WORKER_DIED.search(first.detail)
    f.kind, f.rank = "dataloader", first.rank
    f.how = f"worker killed by signal: {m.group(2).strip()}" if m.group(2) else \
        "worker exited unexpectedly"
    _say(f, f"dataloader: rank {first.rank}'s DataLoader worker (pid {m.group(1).strip()})"
            f" died: {first.detail[:120]!r} ({first.source})", first)
    f.phase, f.phase_seen = "between_saves", True
    f.rules.append("phase between_saves: the rank was fetching a training batch")
    return True


def _abort(obs, stopped, ranks, f: Finding) -> bool:
    """A process group that was there (the rank got as far as a collective, or as its
    teardown) and is gone: aborted under the rank, not a script that never made one."""
    gone = [o for o in obs if o.what == "error" and not ECHO.search(o.detail) and (
        GROUP_GONE.search(o.detail) and o.phase == "collective"
        and "init_process_group" not in " ".join(o.frames)
        or TEARDOWN_FOUND_NONE.search(o.detail) and o.phase == "exit")]
    if not gone or any(o.what == "collective_timeout" for o in obs):
        return False
    first = next((o for o in gone if o.rank is not None), gone[0])
    f.kind, f.rank, f.how = "abort", first.rank, first.detail[:160]
    where = "teardown (destroy_process_group)" if first.phase == "exit" else "collective"
    _say(f, f"abort: rank {first.rank}'s {where} found its process group gone"
            f" ({first.detail[:100]!r}, {first.source}): it was aborted under the rank", first)
    return True


# torch's destroy_process_group when the default group is already gone: a group aborted
# under a rank that trained on (DDP keeps its own handle) is found missing at the end
TEARDOWN_FOUND_NONE = re.compile(r"Process group cannot be None")


def _exception(obs, stopped, ranks, f: Finding) -> bool:
    # a rank whose DataLoader worker died raised, in its data pipeline, what the worker's
    # death left it (a pipe's "Connection reset by peer") before saying the worker died:
    # the dataloader rule tells that
    lost_a_worker = {o.rank for o in obs if o.what == "error" and WORKER_DIED.search(o.detail)}
    errors = [o for o in _own_errors(obs) if not WORKER_DIED.search(o.detail)
              and not (o.phase == "data" and o.rank in lost_a_worker)]
    vanished = _vanished_launch(obs)
    if vanished is not None:  # a launch that vanished before: the errors are its restart's
        errors = [o for o in errors if not _relaunch_of(vanished[0], o.source.file)]
    if not errors:
        return False
    roots = [o for o in errors if o.extra.get("root_cause")]
    first = next((o for o in roots + errors if o.rank is not None), errors[0])
    f.kind, f.rank, f.how = "exception", first.rank, first.detail[:160]
    if first.rank is None:  # an untagged traceback: the summary's entry with its message
        same = [o for o in obs if o.rank is not None and o.detail == first.detail]
        f.rank = same[0].rank if same else None
    _say(f, f"exception: rank {f.rank} raised {first.detail[:100]!r} ({first.source}),"
            " not the echo of a peer's failure", first)
    if _a_load_error(first):
        f.phase, f.phase_seen = "load", True
        f.rules.append("phase load: the error is one a checkpoint that does not load raises")
    return True


def _hang(obs, stopped, ranks, f: Finding) -> bool:
    timeouts = [o for o in obs if o.what == "collective_timeout"]
    # a stack names its rank, or at least its process (py-spy's "Process 48212:")
    stacks = [o for o in obs if o.what == "stack" and (o.rank is not None or o.pid)]
    killed_all = stacks and not _own_errors(obs) and not any(
        o.what == "exit" and o.signal in FATAL for o in obs)
    if not timeouts and not (killed_all and len({_process(o) for o in stacks}) > 1):
        return False
    f.kind, f.how = "hang", "collective timeout" if timeouts else "stacks taken, job killed"
    waiting = {o.rank for o in timeouts if o.rank is not None}
    for o in timeouts[:3]:
        _say(f, f"hang: rank {o.rank} {o.detail} ({o.source})", o)
    flights = [o for o in obs if o.what == "flight" and o.rank is not None and o.seq is not None]
    if len(flights) > 1 and len({o.seq for o in flights}) > 1:
        behind = min(flights, key=lambda o: o.seq or 0)
        f.rank, f.collective = behind.rank, behind.collective
        _say(f, f"rank {behind.rank} is behind in the flight recorder: its last collective is"
                f" #{behind.seq}, the others reached #{max(o.seq or 0 for o in flights)}",
             behind)
        return True
    outside = [o for o in stacks if o.phase != "collective"]
    inside = [o for o in stacks if o.phase == "collective"]
    if inside and len({_process(o) for o in outside}) == 1:
        f.rank = outside[0].rank
        if outside[0].phase == "data":
            f.how = LOADER_WAIT
        f.collective = next((o.collective for o in inside if o.collective), None)
        where = outside[0].frames[-1] if outside[0].frames else "no frame"
        _say(f, f"{_who(outside[0])}'s stack is outside every collective (in {where}) while"
                " the others wait in one", outside[0])
        if f.rank is None:
            f.rules.append("no artefact ties that pid to a rank: the rank is not known")
        return True
    if inside and not outside and len({_waits_in(o) for o in inside}) > 1:
        _out_of_step(inside, f)
        return True
    alive = sorted({o.rank for o in obs if o.reason == "stopped by the launcher"
                    and o.rank is not None} - waiting)
    if len(alive) == 1:
        f.rank = alive[0]
        f.rules.append(f"rank {f.rank} was still running when the launcher stopped the job"
                       " after the timeout: it is the one waited for")
        return True
    known = set(ranks) | waiting
    if waiting and len(known - waiting) == 1 and len(known) > 2:
        f.rank = (known - waiting).pop()
        f.rules.append(f"rank {f.rank} is the only rank of the job ({len(known)} seen) whose"
                       " collective did not time out: the others waited for it")
        return True
    if len(known) == 2 and len(waiting) == 1:
        f.rank = (known - waiting).pop()
        f.rules.append(f"rank {f.rank}: the only other rank of a job of two waited for")
        return True
    f.rules.append("the rank waited for is not known: no flight-recorder dump or stack"
                   " tells it")
    return True


def _waits_in(stack: Observation) -> str:
    """The collective a stack waits in: its name, or the innermost frame (a backward's
    all-reduce runs under autograd, with no collective's name on the stack)."""
    return stack.collective or (function_of(stack.frames[-1]) if stack.frames else "")


def _out_of_step(inside: list[Observation], f: Finding) -> None:
    """Every rank waits in a collective, not all in the same one: each waits for a peer
    that has gone past or not come to it, so no stack says which rank began it."""
    where = ", ".join(f"rank {o.rank} in {_waits_in(o)}" for o in inside[:4])
    f.how = "ranks wait in different collectives"
    f.alternatives = ["abort"]
    f.alternatives_why = ("a rank whose collective failed and that went on (a framework that"
                          " catches the error, as Lightning does around its broadcast of a"
                          " SIGTERM flag) is out of step with its peers just as a rank that"
                          " took its own path is; no line says which")
    f.rules.append(f"hang: every rank waits in a collective, not the same one ({where}): the"
                   " ranks' collectives went out of step; the rank that skipped one is not"
                   " known")
    f.sources.extend(str(o.source) for o in inside[:4])


# a job ended at its time limit had hung, not run out of time, when its log had been
# silent this many times its own step interval (and at least HUNG_SILENCE_MIN seconds)
HUNG_SILENCE_STEPS = 20
HUNG_SILENCE_MIN = 30.0


def _limit_ended_hang(obs, stopped, ranks, f: Finding) -> bool:
    """The scheduler ended the job at its time limit long after the log's last step: the
    training had stopped, and the limit only ended the wait. A job still stepping when
    its limit came ran out of time instead (`_preempt`: a SIGTERM, then a SIGKILL)."""
    ends = [o for o in obs if o.what == "job_state" and o.reason == "TIMEOUT"
            and o.time is not None]
    if not ends:
        return False
    end = min(ends, key=lambda o: o.time or 0.0)
    first_seen: dict[int, float] = {}
    last_by_rank: dict[int | None, int] = {}
    for o in obs:
        if o.what == "step" and o.step is not None and o.time is not None \
                and o.time <= (end.time or 0.0):
            first_seen[o.step] = min(first_seen.get(o.step, o.time), o.time)
            last_by_rank[o.rank] = max(last_by_rank.get(o.rank, o.step), o.step)
    steps = sorted(first_seen)
    if len(steps) < 3:
        return False
    intervals = sorted(first_seen[b] - first_seen[a] for a, b in zip(steps, steps[1:]))
    interval = intervals[len(intervals) // 2]
    silence = (end.time or 0.0) - first_seen[steps[-1]]
    if silence < max(HUNG_SILENCE_MIN, HUNG_SILENCE_STEPS * interval):
        return False
    f.kind, f.how = "hang", "ended by the time limit"
    last_step = next(o for o in obs if o.what == "step" and o.step == steps[-1])
    _say(f, f"hang: the scheduler ended the job at its time limit ({end.source}) {silence:.0f} s"
            f" after the last step the log shows (step {steps[-1]}, {last_step.source}), while"
            f" steps had come every {interval:.2f} s: the training had stopped, and the limit"
            " only ended the wait", end, last_step)
    ranked = {r: s for r, s in last_by_rank.items() if r is not None}
    behind = [r for r, s in ranked.items() if s < max(ranked.values())] if ranked else []
    if len(ranked) == 1 and not any(o.rank not in (None, *ranked) for o in obs):
        f.rank = next(iter(ranked))
        f.rules.append(f"rank {f.rank} is the only rank the artefacts name")
    elif len(behind) == 1:
        f.rank = behind[0]
        f.rules.append(f"rank {f.rank}'s last step is {ranked[f.rank]}, the others reached"
                       f" {max(ranked.values())}: it stopped first")
    else:
        f.rules.append("every rank's log stops at the same step: which rank stopped first"
                       " is not known (stacks or a flight-recorder dump would say)")
    return True


def _signal_death(obs, stopped, kinds: tuple[str, ...]) -> list[Observation]:
    return [o for o in obs if o.what == "exit" and o.pid not in stopped
            and o.reason != "stopped by the launcher"
            and (o.signal in kinds or "SIGTERM" in kinds and o.exitcode == 143)]


def _preempt(obs, stopped, ranks, f: Finding) -> bool:
    deaths = [o for o in _signal_death(obs, stopped, ("SIGTERM",)) if not _torn_down(o, obs)]
    # a handler that caught it may end the rank with exit 0 (Lightning's does): only its
    # line is left
    caught = [o for o in obs if o.what == "signal" and o.signal == "SIGTERM"
              and not _launcher_stopped_before(o, obs)]
    said = [o for o in obs if o.what == "node_lost" and o.reason in ("PREEMPTED",
                                                                       "PreemptionByScheduler")
            # slurmstepd's word in the job's output that it ended the job at its time
            # limit (a SIGTERM, then a SIGKILL after KillWait). A bare "CANCELLED" is
            # also what srun prints after it aborts a step whose task failed
            or o.what == "job_state" and o.reason == "TIMEOUT" and o.source.line is not None]
    if not deaths and not caught and not said:
        return False
    # a rank's death or its own word first, else the scheduler's reason, else torchrun's
    first = (deaths or [o for o in caught if o.rank is not None] or said or caught)[0]
    f.kind, f.rank, f.how, f.node = "preempt", first.rank, "SIGTERM", first.extra.get("node")
    who = f"rank {first.rank}" if first.rank is not None else "the job"
    if first in caught and first.extra.get("launcher"):
        _say(f, f"preempt: torchrun got a SIGTERM from outside and stopped its workers"
                f" ({first.source})", first)
    elif first in caught:
        _say(f, f"preempt: {who} said it got a SIGTERM ({first.detail[:80]!r}), and no"
                f" launcher line before it sent one ({first.source})", first)
    elif first in said and first.what == "job_state":
        _say(f, f"preempt: the scheduler says it ended the job ({first.detail},"
                f" {first.source}): a SIGTERM to every task, then a SIGKILL", first)
    elif first in said:
        _say(f, f"preempt: the scheduler says it preempted the job ({first.detail},"
                f" {first.source})", first)
    else:
        _say(f, f"preempt: {who} ended by SIGTERM the launcher did not send"
                f" ({first.source})", first)
    return True


def _torn_down(death: Observation, obs: list[Observation]) -> bool:
    """A pod the Kubeflow operator stopped (SIGTERM) after another replica failed: the
    PyTorchJob says which replicas failed, and this one's is not among them."""
    replica = death.extra.get("replica")
    failed = {r for o in obs if o.what == "job_state"
              for r in o.extra.get("failed_replicas", ())}
    return replica is not None and bool(failed) and replica not in failed


def _launcher_stopped_before(said: Observation, obs: list[Observation]) -> bool:
    """Whether the launcher's own SIGTERM ("Sending process N closing signal SIGTERM")
    came before a rank's word that it got one: then that word is the launcher's stop. A
    worker's own file (torchrun --log-dir) has no place among the launcher's lines: any
    stop of its attempt may be the one it heard."""
    stops = [o for o in obs if o.reason == "stopped by the launcher"]
    if worker_of(said.source.file):
        return bool(stops)
    return any(o.source.file == said.source.file
               and (o.source.line or 0) < (said.source.line or 0) for o in stops)


def _kill(obs, stopped, ranks, f: Finding) -> bool:
    deaths = _signal_death(obs, stopped, ("SIGKILL",))
    if not deaths:
        return False
    first = next((o for o in deaths if o.rank is not None), deaths[0])
    f.kind, f.rank, f.how = "kill", first.rank, "SIGKILL"
    _say(f, f"kill: {_who(first)} ended by SIGKILL the launcher did not send"
            f" ({first.source})", first)
    if first.rank is None:
        _rank_of_a_local_death(obs, ranks, f)
    return True


def _in_a_loader_worker(o: Observation) -> bool:
    """A fatal signal's dump from a DataLoader worker process (its frames run under
    `_worker_loop`): the worker's death, which its rank reports and the dataloader rule
    tells, not the rank's."""
    return any(frame.startswith("_worker_loop ") for frame in o.frames)


def _who(o: Observation) -> str:
    if o.rank is not None:
        return f"rank {o.rank}"
    if "local_rank" in o.extra:  # a node's launcher line, on a node whose ranks are not known
        return f"local rank {o.extra['local_rank']} of the node that wrote {o.source.file}"
    if o.pid:
        return f"the process with pid {o.pid}"
    return f"{o.host}" if o.host else "a rank"  # a pod's status: its name


def _process(o: Observation) -> tuple[str, int | None]:
    """Which process an observation is of: its rank, else its pid."""
    return ("rank", o.rank) if o.rank is not None else ("pid", o.pid)


def _rank_of_a_local_death(obs: list[Observation], ranks: dict[int, RankStory],
                           f: Finding) -> None:
    """The global rank of a death a node's launcher told by its local rank only: the one
    rank with no word of its own while a peer saw its connection close."""
    silent = _silent_ranks(obs, ranks)
    if len(silent) == 1:
        f.rank = silent[0]
        f.rules.append(f"rank {f.rank} is the only rank with no word of its own while a peer"
                       f" saw its connection close: the rank that died was rank {f.rank}")
    else:
        f.rules.append("the global rank of that local rank is not known: the logs do not say"
                       " in which order the nodes joined")


def _silent_peer(obs, stopped, ranks, f: Finding) -> bool:
    """Ranks that saw a peer close its connection, and one rank that said nothing at all:
    it died by a signal that leaves no traceback (SIGKILL, the OOM killer)."""
    echoes = [o for o in obs if o.what == "peer_lost"]
    if not echoes:
        return False
    silent = _silent_ranks(obs, ranks)
    _say(f, f"a peer closed its connection ({echoes[0].source}): the rank that died did so"
            " without a traceback", echoes[0])
    f.kind, f.how = "kill", "SIGKILL (no traceback, no exit line)"
    # torchrun names only the first rank it sees fail; the one that died first may be
    # gone with no line at all, whatever the signal
    f.alternatives = ["crash", "oom"]
    f.alternatives_why = ("a SIGKILL, the OOM killer, and a fatal signal in a script with"
                          " no faulthandler all end a rank without a word; no exit line or"
                          " kernel log says which")
    if len(silent) == 1:
        f.rank = silent[0]
        f.rules.append(f"kill: rank {f.rank} is the only rank with no word in the logs; a"
                       " death that leaves none is a SIGKILL, the OOM killer, or a fatal"
                       " signal with no faulthandler (no exit line or kernel log says which)")
    elif silent:
        f.rules.append("the rank that died is not known: more than one rank left no word")
    else:
        f.rules.append("the rank that died is not known: every rank the artefacts name"
                       " spoke, and nothing tells how many ranks the job had")
    return True


def _silent_ranks(obs: list[Observation], ranks: dict[int, RankStory]) -> list[int]:
    """The job's ranks with no word of their own (no error, exit, stack or timeout) where
    a peer saw its connection close; [] where no peer did."""
    if not any(o.what == "peer_lost" for o in obs):
        return []
    spoke = {o.rank for o in obs if o.what in ("peer_lost", "error", "exit", "stack",
                                                "collective_timeout") and o.rank is not None}
    return sorted(set(ranks) - spoke)


def _node_said(obs, stopped, ranks, f: Finding) -> bool:
    """A scheduler or operator that says a node failed: the peers' timeouts, lost
    connections and the signals that ended the job after it are its echoes."""
    said = [o for o in obs if o.what == "node_lost"
            and o.reason not in ("PREEMPTED", "PreemptionByScheduler")]
    if not said:
        return False
    # srun's and slurmctld's lines name the node; sacct's NodeList is the whole allocation
    first = next((o for o in said if o.host and not re.search(r"[\[,]", o.host)),
                 next((o for o in said if o.host), said[0]))
    how = first.reason or "node lost"
    f.kind, f.node = "node", first.extra.get("node")
    f.how = f"{how} on {first.host}" if first.host else how
    f.alternatives = ["power_loss"] if first.reason == "NODE_FAIL" else []
    _say(f, f"node: {first.detail or first.reason} ({first.source})", first)
    _rank_left_behind(obs, f)
    return True


def _rank_left_behind(obs, f: Finding) -> None:
    """The rank on a lost node stops where the node died; the others finish the step it
    was in and wait for it: the one rank whose last logged step is behind all others'."""
    last: dict[int, int] = {}
    for o in obs:
        if o.what == "step" and o.step is not None and o.rank is not None:
            last[o.rank] = max(last.get(o.rank, o.step), o.step)
    if len(last) < 2:
        return
    behind = [r for r, s in last.items() if s < max(last.values())]
    if len(behind) == 1:
        f.rank = behind[0]
        f.rules.append(f"rank {f.rank}'s last step is {last[f.rank]}, the others reached"
                       f" {max(last.values())}: it was on the lost node")


def _node(obs, stopped, ranks, f: Finding) -> bool:
    """A launch that vanished: its log ends with no failure and no success, and a later
    launch took over."""
    vanished = _vanished_launch(obs)
    if vanished is None:
        return False
    ended, after = vanished
    f.kind, f.how, f.node = "node", "the launcher and its ranks vanished", None
    f.alternatives = ["power_loss"]
    then = {"resume": "resumed", "no_checkpoint": "found no checkpoint to resume from",
            "log_file": f"printed every kind of line {ended} did and went on past it"}.get(
        after.what, "failed reading the checkpoint")
    f.rules.append(f"node: {ended} ends with no failure and no success, and {after.source}"
                   f" {then}: the node went down")
    f.sources.append(f"{ended}:end")
    if after.what in ("resume", "no_checkpoint"):
        _lost_save(obs, ended, after, f)
    return True


def _vanished_launch(obs: list[Observation]) -> tuple[str, Observation] | None:
    """(a launch's log that ends with no failure and no success, what shows a later launch
    took over: a resume, a failure reading the checkpoint (in a load, or an error that
    says the data read was bad), or a log that went on past where the first one
    stopped), or None. Only a relaunch's log counts (`_relaunch_of`: slurm-41.out,
    slurm-42.out): another log in the folder (a build's, a tool's) is no launch of the
    job."""
    logs = sorted({o.source.file for o in obs if o.what == "log_file"}, key=_order)
    took_over = [o for o in obs if o.what in ("resume", "no_checkpoint") or o.what == "error"
                 and (o.phase == "load" or BAD_DATA.search(o.detail) and o.phase != "data")
                 and not ECHO.search(o.detail)]
    for name in logs:
        if any(o.source.file == name and o.what in ("exit", "error", "restart", "resume")
               for o in obs) or _ended_as_meant(name, obs):
            continue
        after = [o for o in took_over if _relaunch_of(name, o.source.file)] + \
            [o for o in obs if o.what == "log_file" and _relaunch_of(name, o.source.file)
             and _went_on_past(name, o, obs)]
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


def _went_on_past(ended: str, later: Observation, obs: list[Observation]) -> bool:
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


# a save the log says is done (not one begun: "saving checkpoint to ..."), as "saved
# checkpoint ...", "checkpoint ... committed", "Finished saving the checkpoint in 0.05 s"
SAVE_DONE = re.compile(r"\b(saved|wrote|written|committed|finished|completed?)\b", re.I)


def _lost_save(obs: list[Observation], ended: str, resume: Observation, f: Finding) -> None:
    """A node that vanished after its log said a checkpoint was saved, and a restart that
    resumed from an older one or found none: the finished save did not survive, as a
    power loss drops what was never made durable (a killed process's writes stay in the
    page cache)."""
    done, pending = _saves_in(obs, ended)
    start = 0 if resume.what == "no_checkpoint" else resume.step
    if done and start is not None:
        step, last = max(done, key=lambda d: d[0])
        if start >= step:
            return
    elif resume.what == "no_checkpoint":  # any save said done, whatever step it was of
        said = _saves_said_done(obs, ended)
        if not said:
            return
        step, last = None, said[-1]
    else:
        return
    found = f"resumed from step {start}" if resume.what == "resume" else \
        "found no checkpoint to resume from"
    saved = f"the checkpoint of step {step}" if step is not None else "a checkpoint"
    f.kind, f.how, f.alternatives = "power_loss", "a finished save lost with the node", []
    if resume.extra.get("started_over"):  # not said: a script that never resumes does so too
        f.alternatives = ["node"]
        f.alternatives_why = ("a relaunch that started over without a word fits a save lost,"
                              " and a script that never looks for its checkpoint")
    _say(f, f"power_loss: {last.source} says {saved} was saved,"
            f" yet {resume.source} {found}: a finished save did not survive the node (never"
            " made durable: no fsync of it or its folder)", last, resume)
    if step is None:
        return  # no step to place the death after: the rules that place it do
    if pending is not None and (pending.step or 0) > step:
        f.phase, f.phase_seen = "mid_save", True
        f.rules.append(f"phase mid_save: {pending.source} began the save of step"
                       f" {pending.step}, and the log never said it was done")
    elif any(o.what == "step" and o.source.file == ended and o.step is not None
             and o.step > step for o in obs):
        f.phase, f.phase_seen = "between_saves", True
        f.rules.append(f"phase between_saves: the log went on training after the save of"
                       f" step {step} was done, and began no other")
    # else: the log says nothing after that save (a script that prints only at its saves):
    # the phase is left to the rules that place it


def _save_number(step: int | None, interval: int | None) -> int | None:
    """Which save of a launch that started at step 0 the save of `step` is, where saves
    come every `interval` steps; None where either is not known."""
    if step is None or not interval or step % interval:
        return None
    return step // interval


def _saves_said_done(obs: list[Observation], log: str) -> list[Observation]:
    """The lines of `log` that say a save is done, in the log's order."""
    return sorted((o for o in obs if o.what == "save" and o.source.file == log
                   and SAVE_DONE.search(o.detail)), key=lambda o: o.source.line or 0)


def _saves_in(obs: list[Observation], log: str):
    """([(step, line)] of the saves `log` says are done, the save it began last and never
    said done, or None). A done line with no step of its own finishes the save begun
    just before it ("Saving the checkpoint at step 10 ...", then "Finished saving the
    checkpoint in 0.05 seconds")."""
    done, begun = [], None
    lines = sorted((o for o in obs if o.what == "save" and o.source.file == log),
                   key=lambda o: o.source.line or 0)
    for o in lines:
        if not SAVE_DONE.search(o.detail):
            begun = o
            continue
        step = o.step if o.step is not None else begun.step if begun is not None else None
        if step is not None:
            done.append((step, o))
        begun = None
    return done, begun


# what names one of several logs of one launch: a node's, a rank's (rank-1.log), a
# Kubeflow PyTorchJob worker pod's (gpt2-ddp-worker-1.log)
SIBLING = re.compile(r"(?<=node)[-_]?\d+|(?<=rank)[-_]?\d+|(?<=worker)[-_]?\d+", re.I)
# a Slurm array's task in sbatch's default name (slurm-%A_%a.out: slurm-41_3.out): the
# tasks of one array run side by side; a resubmitted array has another job id
ARRAY_TASK = re.compile(r"(?<=slurm-)(\d+)_\d+")


def _relaunch_of(log: str, file: str) -> bool:
    """Whether `file` is a later launch's log of the job that wrote `log`: in its folder,
    after it, and named as it is, numbers aside (launch-0-node-0.log, launch-1-node-0.log),
    and not a sibling's (another node's, rank's or array task's of the same launch)."""
    return _order(file) > _order(log) and _same_folder(log, file) and \
        re.sub(r"\d+", "#", log) == re.sub(r"\d+", "#", file) and \
        _launch_of(log) != _launch_of(file)


def _launch_of(log: str) -> str:
    """The log's name with what tells siblings apart blanked out."""
    return ARRAY_TASK.sub(r"\1_#", SIBLING.sub("#", log))


def _order(name: str) -> tuple:
    """A log's place among the job's logs: by name, its numbers as numbers (run9.log
    before run10.log, slurm-9999.out before slurm-10000.out)."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", name)))


def _same_folder(a: str, b: str) -> bool:
    return a.rpartition("/")[0] == b.rpartition("/")[0]


def _failed_without_a_traceback(obs, stopped, ranks, f: Finding) -> bool:
    """A worker that exited with a code of its own (1: Python's for an uncaught
    exception) whose traceback the artefacts do not hold (a script not under @record,
    its stderr elsewhere): torchrun's root cause, else the first such exit."""
    exited = [o for o in obs if o.what == "exit" and o.exitcode and o.exitcode > 0
              and o.signal is None and o.pid not in stopped
              and o.reason != "stopped by the launcher" and o.exitcode != 143]
    if not exited:
        return False
    first = next((o for o in exited if o.extra.get("root_cause")),
                 next((o for o in exited if o.rank is not None), exited[0]))
    f.kind, f.rank, f.node = "exception", first.rank, first.extra.get("node")
    f.how = f"exit code {first.exitcode}; its traceback is not in the artefacts"
    _say(f, f"exception: {_who(first)} exited with code {first.exitcode} ({first.source}) and"
            " no traceback of it is in the artefacts: an uncaught exception exits so (so"
            " does a sys.exit of that code)", first)
    return True


def _checkpoint_only(obs, stopped, ranks, f: Finding) -> bool:
    bad = [o for o in obs if o.what == "checkpoint" and o.extra.get("loads") is False]
    if not bad:
        return False
    f.kind, f.how = "torn_write", bad[0].detail
    _say(f, f"torn_write: {bad[0].source} {bad[0].detail}; no death is in the artefacts",
         bad[0])
    return True


# -- where in the job ---------------------------------------------------------------------

def _place(obs: list[Observation], incident: Incident, later: list[Observation],
           sources: dict[str, list[str]]) -> None:
    """The phase, the step window and the role of the finding, each with its rule."""
    f = incident.finding
    story = incident.ranks.get(f.rank) if f.rank is not None else None
    steps = sorted({o.step for o in obs if o.what == "step" and o.step is not None})
    last = story.last_step if story and story.last_step is not None else \
        (steps[-1] if steps else None)
    failed_at = _first_failure_line(obs, f)
    before = [s for o in obs if o.what == "step" and o.step is not None
              and (failed_at is None or _earlier(o, failed_at)) for s in (o.step,)]
    if failed_at is not None:
        last = max(before) if before else None
    # the next step the failure's own log shows (a later launch's steps, counted again
    # from a resume or from scratch, do not bound when this one died)
    next_steps = sorted({o.step for o in obs if o.what == "step" and o.step is not None
                         and last is not None and o.step > last
                         and (failed_at is None or o.source.file == failed_at.file)})
    f.step_window = (last, next_steps[0] if next_steps else None)
    if f.kind == "unknown" and len({o.source.file for o in obs if o.what == "step"}) > 1:
        f.step_window = (None, None)  # no failure told: which launch's steps it followed
    logged = f.step_window[0]  # the last step the failure's own log reached
    # (an abort shows where the rank next used its group, which may be past the save the
    # restart resumed from: that save bounds the symptom, not when the group went)
    if logged is None and f.kind not in ("unknown", "abort"):
        _reached_before(f, later)
    if f.phase == "unknown":
        _phase(_Placing(obs, incident, story, failed_at, later, sources, logged))
    if f.kind == "node" or f.node is not None and f.rank is None:
        f.role = "node"
    elif f.rank is not None:
        writer = _writer(obs)
        f.role = "writer" if f.rank == (writer or 0) else "other"
        if writer is None:
            f.rules.append("rank 0 is taken as the rank that writes checkpoints: the log"
                           " names no other")
    again = incident.restart_failure
    if again is not None and again.rank is not None:
        again.role = "writer" if again.rank == (_writer(obs + later) or 0) else "other"
    # a node that went down inside a save, or at a point nothing shows (the phase placed
    # by rule), fits a write cut short by its death as well
    if f.kind == "node" and (f.phase == "mid_save" or not f.phase_seen) \
            and "torn_write" not in f.alternatives:
        f.alternatives.append("torn_write")
    if f.alternatives:
        why = f.alternatives_why or ("a power loss that drops nothing fsynced, and a write"
                                     " cut short by the death, leave what a node loss leaves")
        incident.unknowns.append(f"{f.kind} or {' or '.join(f.alternatives)}: the artefacts"
                                 f" fit each ({why})")
    if f.step_window[0] is None:
        before = f", only that it came before step {f.step_window[1]}" \
            if f.step_window[1] is not None else ": the log names none before it"
        incident.unknowns.append(f"no step is known for the {f.kind}{before}")


def _restart_resume(later: list[Observation],
                    after: Iterable[Observation] = ()) -> Observation | None:
    """The resume, naming a step, of the restart right after the failure: the first word of
    progress the later launches print, where it is a resume. A later restart's resume,
    after one that started over and trained, says nothing of the failure. Where no later
    launch prints any, the first such resume in `after` (the failure's launch, after it)."""
    told = [o for o in later if o.what in ("resume", "no_checkpoint", "step", "save")]
    if told:
        first = min(told, key=lambda o: (_order(o.source.file), o.source.line or 0))
        return first if first.what == "resume" and first.step is not None else None
    return next((o for o in after if o.what == "resume" and o.step is not None), None)


def _reached_before(f: Finding, later: list[Observation]) -> None:
    """Where no line of the failure's own launch names a step, the save the restart
    resumed from does: the job had finished it before it failed."""
    first = _restart_resume(later)
    if first is None:
        return
    f.step_window = (first.step, None)
    f.rules.append(f"after step {first.step}: {first.source} resumed from its save, which"
                   f" the job had finished before the {f.kind}")


def _writer(obs: list[Observation]) -> int | None:
    """The rank that writes checkpoints: the lowest that logged a save; None if none did."""
    return min((o.rank for o in obs if o.what == "save" and o.rank is not None), default=None)


@dataclass
class _Placing:
    """What the phase rules read: the first failure's observations and where it shows in
    the log, the restart's observations, and the script's own lines."""

    obs: list[Observation]
    incident: Incident
    story: RankStory | None  # the failing rank's, where one is named
    failed_at: Source | None
    later: list[Observation]
    sources: dict[str, list[str]]
    logged: int | None  # the last step the failure's own log reached, if it names one

    @property
    def finding(self) -> Finding:
        return self.incident.finding

    @cached_property
    def saved_before(self) -> Source | None:
        """The first save said done in the failure's log before the failure ("Epoch 1 |
        Training snapshot saved at snapshot.pt"): where no step line came before it, the
        job was training, past its start."""
        at = self.failed_at
        if at is None or at.line is None:
            return None
        done = [o.source for o in _saves_said_done(self.obs, at.file)
                if o.source.line is not None and o.source.line < at.line]
        return done[0] if done else None


def _phase(placing: _Placing) -> None:
    """The first rule of PHASE_RULES that places the finding decides (the last always
    does)."""
    next(rule for rule in PHASE_RULES if rule(placing))


def _aborted_before_its_teardown(p: _Placing) -> bool:
    """An abort found at the rank's teardown: the group went at a point nothing shows,
    before the end the log reached."""
    f = p.finding
    if f.kind != "abort" or not TEARDOWN_FOUND_NONE.search(f.how):
        return False
    f.step_window = (None, None)  # after the last step line fits as well as before it
    f.alternatives = ["exception"]
    f.alternatives_why = ("a script that destroys its process group twice raises the same at"
                          " its end")
    p.incident.unknowns.append("when the abort came is not known: the rank trained on, and"
                               " only its teardown found the process group gone")
    return True


def _in_own_frames(p: _Placing) -> bool:
    """The failing rank's own frames were in a save or a load."""
    f, story = p.finding, p.story
    if not (story and story.phase in ("save", "load")):
        return False
    f.phase, f.phase_seen = {"save": "mid_save", "load": "load"}[story.phase], True
    f.rules.append(f"phase {f.phase}: rank {story.rank} was in {story.frame}")
    return True


def _temporary_file_left(p: _Placing) -> bool:
    """A save's temporary file is still in the checkpoint folder."""
    temp = [o for o in p.obs if o.what == "checkpoint" and o.extra.get("temp")]
    if not temp:
        return False
    p.finding.phase, p.finding.phase_seen = "mid_save", True
    p.finding.rules.append(f"phase mid_save: {temp[0].source} is {temp[0].detail}")
    return True


def _checkpoint_does_not_load(p: _Placing) -> bool:
    """A checkpoint file does not load: cut short by a death in its save (a hang leaves
    none, so one there is older than the hang)."""
    torn = [o for o in p.obs if o.what == "checkpoint" and o.extra.get("loads") is False]
    if not torn or p.finding.kind == "hang":
        return False
    p.finding.phase, p.finding.phase_seen = "mid_save", True
    p.finding.rules.append(f"phase mid_save: {torn[0].source} does not load"
                           f" ({torn[0].detail})")
    return True


def _save_left_open(p: _Placing) -> bool:
    return p.finding.kind != "hang" and _save_the_log_left_open(p.obs, p.finding,
                                                                p.failed_at, p.later, p.logged)


def _resumed_without_a_step(p: _Placing) -> bool:
    """The log's last resume before the failure has no step after it: the failure came
    in the load or right after it."""
    obs, failed_at, f = p.obs, p.failed_at, p.finding
    resumes = [o for o in obs if o.what == "resume" and (failed_at is None
                                                         or _earlier(o, failed_at))]
    if not resumes:
        return False
    if any(o.what == "step" and _earlier(resumes[-1], o.source)
           and (failed_at is None or _earlier(o, failed_at)) for o in obs):
        return False
    f.phase, f.phase_seen = "after_resume", True
    f.rules.append(f"phase after_resume: it failed after {resumes[-1].source} resumed and"
                   " before any step was logged")
    return True


def _where_peers_waited(p: _Placing) -> bool:
    # the failing rank's own frames, where they tell a phase, say more than its peers'
    return not (p.story and p.story.phase) and _peers_waiting(p.obs, p.finding, p.sources)


def _in_a_collective(p: _Placing) -> bool:
    """The failing rank was in a collective, or the job hung: a training step's."""
    f, story = p.finding, p.story
    if not (story and story.phase == "collective" or f.kind == "hang"):
        return False
    f.phase, f.phase_seen = "between_saves", story is not None and story.phase is not None
    f.rules.append("phase between_saves: in a collective of a training step"
                   if f.phase_seen else "phase between_saves: a hang in a training step")
    return True


def _nothing_failed(p: _Placing) -> bool:
    if p.finding.kind != "unknown":
        return False
    p.incident.unknowns.append("no failure is told, so none is placed: the artefacts show"
                               " no death, error, timeout or vanished launch")
    p.finding.step_window = (None, None)  # the last step of a run that may have finished
    return True


def _no_step_before(p: _Placing) -> bool:
    f = p.finding
    if f.step_window[0] is not None or p.saved_before is not None:
        return False
    f.phase = "unknown"
    p.incident.unknowns.append(f"the phase of the {f.kind} is not known: no frame, no"
                               " checkpoint leftover and no step before it in the"
                               " artefacts")
    return True


def _between_saves_by_rule(p: _Placing) -> bool:
    f = p.finding
    f.phase, f.phase_seen = "between_saves", False
    saved = p.saved_before if f.step_window[0] is None else None
    before = f"step {f.step_window[0]} came before it" if saved is None else \
        f"the log said a save was done before it ({saved}; no step line)"
    f.rules.append(f"phase between_saves by rule: no frame of the {f.kind} is known, no"
                   f" save was left unfinished, and {before}")
    return True


# The phase rules, in the order they are tried: an abort found only at the end, what
# the failing rank was seen doing, then what the checkpoint folder and the log left, then
# where its peers waited; the last places it by rule.
PHASE_RULES = (_aborted_before_its_teardown, _in_own_frames, _temporary_file_left,
               _checkpoint_does_not_load, _save_left_open, _resumed_without_a_step,
               _where_peers_waited, _in_a_collective, _nothing_failed, _no_step_before,
               _between_saves_by_rule)


def _save_the_log_left_open(obs: list[Observation], f: Finding, failed_at: Source | None,
                            later: list[Observation], reached: int | None) -> bool:
    """A death mid-save that the log and the restart's resume tell, with the save's number
    where the steps between saves are known: a save begun and not said done before the
    failure; a save the log's steps had come to whose checkpoint the restart did not find
    (it resumed from an older one); or the save of the last step reached, which the
    restart resumed from but the log never said done (the rank died at its end)."""
    interval = save_interval(obs + later)
    # the saves the failure's log said were done before it, and the one it began last and
    # had not said done; a log that never says a save is done leaves every save begun
    done, pending = _saves_in([o for o in obs if _earlier(o, failed_at)], failed_at.file) \
        if failed_at is not None else ([], None)
    said_done = max((step for step, _ in done), default=None)
    if said_done is not None and pending is not None:
        f.phase, f.phase_seen = "mid_save", True
        f.save = _save_number(pending.step, interval)
        f.rules.append(f"phase mid_save: {pending.source} began the save of step"
                       f" {pending.step}, and the log, which says when a save is done, did"
                       " not say so before the failure")
        return True
    first_resume = _restart_resume(
        later, [o for o in obs if failed_at is not None and not _earlier(o, failed_at)])
    if first_resume is None or reached is None:
        return False
    due = (reached // interval) * interval if interval else None
    if due is not None and first_resume.step < reached and due > first_resume.step \
            and (said_done is None or said_done < due):  # a save said done was lost instead
        f.phase, f.phase_seen, f.save = "mid_save", True, _save_number(due, interval)
        f.rules.append(f"phase mid_save: the log reached step {reached}, checkpoints come every"
                       f" {interval} steps, yet the restart resumed from step"
                       f" {first_resume.step} ({first_resume.source}): the save of step {due}"
                       " never finished")
        return True
    if said_done is not None and first_resume.step == reached and said_done < reached:
        f.phase, f.phase_seen = "mid_save", True
        f.save = _save_number(first_resume.step, interval)
        f.rules.append(f"phase mid_save: the log reached step {reached}, and the restart"
                       f" resumed from that step's checkpoint ({first_resume.source}), which"
                       " the log, saying when each save is done, never said done: the rank"
                       " died at the save's end, its files written")
        return True
    # the same where the log prints a step's line only with its save ("step 15 ... saved"):
    # the restart resumed from a save past every line, in a log that went on after the
    # death (its peers' echoes), so the line was not lost with a node
    if said_done is not None and first_resume.step > reached >= said_done \
            and interval and first_resume.step % interval == 0 \
            and failed_at is not None and failed_at.line != LOG_END:
        f.phase, f.phase_seen = "mid_save", True
        f.save = _save_number(first_resume.step, interval)
        f.rules.append(f"phase mid_save: the log's last save said done is step {said_done},"
                       f" and the restart resumed from step {first_resume.step}"
                       f" ({first_resume.source}), a save the log, saying when each save is"
                       " done, never said done: the rank died at that save's end, its files"
                       " written")
        return True
    return False


def _peers_waiting(obs: list[Observation], f: Finding, sources: dict[str, list[str]]) -> bool:
    """The phase from where the surviving ranks waited when the failing one went: a
    collective the script reaches right after its checkpoint save (the failing rank never
    got there: it was saving), a collective inside a save, or a training step's collective
    in a script whose saves are fenced by a collective (no rank runs ahead of a save)."""
    if f.kind in ("hang", "node", "unknown", "torn_write", "power_loss"):
        return False
    # phase -> (why, the peer it stands on, whether that peer waited inside a save)
    said: dict[str, tuple[str, Observation, bool]] = {}
    for o in obs:
        if o.what != "error" or o.rank == f.rank or not ECHO.search(o.detail):
            continue
        loop = frameworks.loop_of(o.frames)
        if any(phase_of_frames([frame]) == "save" for frame in o.frames) \
                or loop is not None and loop.in_save(o.frames):
            said.setdefault("mid_save", (f"rank {o.rank} waited inside a checkpoint save"
                                         f" ({o.frames[-1]}) ({o.source})", o, True))
            continue
        if loop is not None and o.phase == "collective":
            said.setdefault("between_saves", (f"rank {o.rank} waited in a collective of"
                            f" {loop.framework}'s training step ({o.frames[-1]}, {o.source}),"
                            f" and {loop.framework} fences every save: {loop.fence}; no"
                            " rank runs a step while another saves", o, False))
            continue
        code = [c for c in o.extra.get("code") or () if c[0] in sources]
        if not code or o.phase != "collective":
            continue
        waited = _after_save(code, sources)
        if waited is not None:
            (path, number, quoted), save = waited
            name = path.rsplit("/", 1)[-1]
            said.setdefault("mid_save", (f"rank {o.rank} waited in `{quoted}` ({name}:{number},"
                                         f" {o.source}), which the script reaches right after"
                                         f" its save (`{sources[path][save - 1].strip()}`,"
                                         f" {name}:{save}): the failing rank never got there",
                                         o, False))
            continue
        fenced = next(((c, fence) for c in reversed(code)
                       if (fence := script_source.fenced_save(sources[c[0]]))), None)
        if fenced is not None:
            (path, number, quoted), (save, fence) = fenced
            lines, name = sources[path], path.rsplit("/", 1)[-1]
            said.setdefault("between_saves", (f"rank {o.rank} waited in a training step's"
                            f" collective (`{quoted}`, {name}:{number}, {o.source}), and the"
                            f" script fences its save ({name}:{save}) with"
                            f" `{lines[fence - 1].strip()}` ({name}:{fence}): no rank"
                            " runs a step while another saves", o, False))
    if len(said) != 1:
        return False
    (phase, (why, peer, inside)), = said.items()
    f.phase, f.phase_seen, f.peers_in_save = phase, True, inside
    _say(f, f"phase {phase}: {why}", peer)
    return True


def _after_save(code: list, sources: dict[str, list[str]]):
    """The innermost frame of the user's code that is a collective call the script makes
    right after a save, with the save's line; None where there is none."""
    for path, number, quoted in reversed(code):
        if script_source.COLLECTIVE_CALL.search(quoted):
            save = script_source.save_before(sources[path], number)
            if save is not None:
                return (path, number, quoted), save
    return None


def save_interval(obs: list[Observation]) -> int | None:
    """Steps between checkpoints, from the steps the checkpoint files and save lines name
    (their greatest common divisor); None where fewer than two are known."""
    import math

    steps = sorted({o.step for o in obs if o.what in ("checkpoint", "save")
                    and o.step is not None and o.step > 0})
    if len(steps) < 2:
        return None
    return math.gcd(*steps) or None


LOG_END = 10**9  # the line of a log's end, where a launch that vanished stopped


def _first_failure_line(obs: list[Observation], f: Finding):
    """Where the failure shows in the log that counts the steps: the end of a log that
    stopped, the rule's own line there, the failing rank's end there, or a peer's echo
    of it there."""
    stepped = {o.source.file for o in obs if o.what == "step"}
    lined = {str(o.source): o.source for o in obs if o.source.line is not None}
    for src in f.sources:
        if src.endswith(":end"):  # a log that ends where the failure is
            return Source(src[:-4], LOG_END)
    for src in f.sources:
        if src in lined and lined[src].file in stepped:
            return lined[src]
    if f.rank is not None:
        ends = [o.source for o in obs if o.rank == f.rank and o.source.file in stepped
                and o.source.line is not None and o.what in ("exit", "error")]
        if ends:
            return min(ends, key=lambda s: s.line)
    # told by a file with no place among the log's lines (a kernel log): a peer's echo of
    # the death in the log comes after it
    echoes = [o.source for o in obs if o.what == "peer_lost" and o.source.file in stepped
              and o.source.line is not None]
    if echoes and f.kind != "hang":
        return min(echoes, key=lambda s: (s.file, s.line))
    return next((lined[src] for src in f.sources if src in lined), None)


def _earlier(o: Any, where: Any) -> bool:
    src = o.source if isinstance(o, Observation) else o
    if src.file != where.file and worker_of(src.file) and not worker_of(where.file):
        # a worker's own file (torchrun --log-dir) in the first failure's view ended
        # with that failure, which the launcher's log tells after it
        return True
    if src.line is None or where.line is None or src.file != where.file:
        return _order(src.file) < _order(where.file) if src.file != where.file else True
    return src.line < where.line


def _script(obs: list[Observation]) -> str | None:
    """The script's file name: as torchrun's summary heads it ("train.py FAILED"), else
    the command line py-spy shows, else the file of a traceback's `<module>` frame."""
    named = [o.extra.get("script") for o in obs if o.extra.get("script")]
    for o in obs:
        command = o.extra.get("command", "")
        named += [w.rsplit("/", 1)[-1] for w in command.split() if w.endswith(".py")][:1]
    for o in obs:
        named += [m.group(1) for frame in o.frames[:1]
                  if (m := re.match(r"<module> \(([^:]+\.py):\d+\)", frame))]
    return named[0] if named else None
