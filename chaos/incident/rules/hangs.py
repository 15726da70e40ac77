"""Failure rules for a job that stopped making progress: a collective that timed out,
stacks taken before a kill, a time limit that ended a silence."""

from __future__ import annotations

from dataclasses import dataclass

from torchchaos.incident.evidence import FATAL, own_errors, stepped_first
from torchchaos.incident.finding import LOADER_WAIT, Finding, FirstFailure, say
from torchchaos.incident.observations import (
    Observation,
    function_of,
)
from torchchaos.incident.rules.deaths import process_of, who_of


def hang(c: FirstFailure) -> bool:
    """A collective timed out (gloo's receive timeout, NCCL's watchdog), or stacks of
    more than one process were taken before the job was killed. The rank waited for is
    the one behind in the flight recorder, else the one whose stack is outside every
    collective (a dump py-spy could not take of a stopped process among them), else, in
    a job of two ranks, the other one."""
    obs, ranks, f = c.obs, c.ranks, c.finding
    timeouts = [o for o in obs if o.what == "collective_timeout"]
    # a stack names its rank, or at least its process (py-spy's "Process 48212:")
    stacks = [o for o in obs if o.what == "stack" and (o.rank is not None or o.pid)]
    killed_all = stacks and not own_errors(obs) and not any(
        o.what == "exit" and o.signal in FATAL for o in obs)
    if not timeouts and not (killed_all and len({process_of(o) for o in stacks}) > 1):
        return False
    f.kind, f.how = "hang", "collective timeout" if timeouts else "stacks taken, job killed"
    waiting = {o.rank for o in timeouts if o.rank is not None}
    for o in timeouts[:3]:
        say(f, f"hang: rank {o.rank} {o.detail} ({o.source})", o)
    flights = [o for o in obs if o.what == "flight" and o.rank is not None and o.seq is not None]
    if len(flights) > 1 and len({o.seq for o in flights}) > 1:
        behind = min(flights, key=lambda o: o.seq or 0)
        f.rank, f.collective = behind.rank, behind.collective
        say(f, f"rank {behind.rank} is behind in the flight recorder: its last collective is"
                f" #{behind.seq}, the others reached #{max(o.seq or 0 for o in flights)}",
             behind)
        return True
    outside = [o for o in stacks if o.phase != "collective"]
    inside = [o for o in stacks if o.phase == "collective"]
    if inside and len({process_of(o) for o in outside}) == 1:
        f.rank = outside[0].rank
        if outside[0].phase == "data":
            f.how = LOADER_WAIT
        f.collective = next((o.collective for o in inside if o.collective), None)
        say(f, f"{who_of(outside[0])}'s stack is outside every collective"
               f" ({_where(outside[0])}) while the others wait in one", outside[0])
        _ended_by_the_scheduler(obs, f)
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


def _where(stack: Observation) -> str:
    """Where a stack outside every collective was, or why py-spy could not tell."""
    if stack.frames:
        return f"in {stack.frames[-1]}"
    if stack.extra.get("stopped"):
        return ("py-spy could not suspend it, as it cannot a process already stopped:"
                " it was stopped (SIGSTOP), outside any collective")
    return f"no frame: {stack.detail}"


def _ended_by_the_scheduler(obs: list[Observation], f: Finding) -> None:
    """A hang the scheduler's time limit or a cancel ended: said, as how it ended."""
    end = next((o for o in obs if o.what == "job_state" and o.reason in ("TIMEOUT",
                                                                       "CANCELLED")), None)
    if end is not None and not any(o.what == "collective_timeout" for o in obs):
        f.how = "stacks taken, ended by the time limit" if end.reason == "TIMEOUT" else \
            "stacks taken, ended by a cancel"
        say(f, f"the scheduler ended the job ({end.detail}, {end.source}): the end of the"
               " wait, not its cause", end)


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


@dataclass
class Silence:
    """How long the log had been silent when the scheduler's time limit ended the job."""

    end: Observation              # the scheduler's word, with its time
    seconds: float                # from the last step line to the end
    interval: float               # the median time between the first sightings of steps
    last_step: int
    last_by_rank: dict[int | None, int]

    @property
    def hung(self) -> bool:
        return self.seconds >= max(HUNG_SILENCE_MIN, HUNG_SILENCE_STEPS * self.interval)


def silence_before_the_time_limit(obs: list[Observation]) -> Silence | None:
    """The silence before a time limit, where the artefacts time both: the scheduler's
    end and at least three step lines before it; None where they do not."""
    ends = [o for o in obs if o.what == "job_state" and o.reason == "TIMEOUT"
            and o.time is not None]
    if not ends:
        return None
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
        return None
    intervals = sorted(first_seen[b] - first_seen[a] for a, b in zip(steps, steps[1:]))
    return Silence(end, (end.time or 0.0) - first_seen[steps[-1]],
                   intervals[len(intervals) // 2], steps[-1], last_by_rank)


def limit_ended_hang(c: FirstFailure) -> bool:
    """The scheduler ended the job at its time limit long after the log's last step: the
    training had stopped, and the limit only ended the wait. A job still stepping when
    its limit came ran out of time instead (`preempt`: a SIGTERM, then a SIGKILL)."""
    obs, f = c.obs, c.finding
    quiet = silence_before_the_time_limit(obs)
    if quiet is None or not quiet.hung:
        return False
    f.kind, f.how = "hang", "ended by the time limit"
    last_step = next(o for o in obs if o.what == "step" and o.step == quiet.last_step)
    end = stepped_first([o for o in obs if o.what == "job_state" and o.reason == "TIMEOUT"],
                        obs)[0]
    say(f, f"hang: the scheduler ended the job at its time limit ({end.source})"
           f" {quiet.seconds:.0f} s after the last step the log shows (step {quiet.last_step},"
           f" {last_step.source}), while steps had come every {quiet.interval:.2f} s: the"
           " training had stopped, and the limit only ended the wait", end, last_step)
    ranked = {r: s for r, s in quiet.last_by_rank.items() if r is not None}
    behind = [r for r, s in ranked.items() if s < max(ranked.values())] if ranked else []
    if len(ranked) == 1 and not any(o.rank not in (None, *ranked) for o in obs):
        f.rank = next(iter(ranked))
        f.rules.append(f"rank {f.rank} is the only rank the artefacts name")
    elif len(behind) == 1:
        f.rank = behind[0]
        f.rules.append(f"rank {f.rank}'s last step is {ranked[f.rank]}, the others reached"
                       f" {max(ranked.values())}: it stopped first")
    elif (stopped := _printed_nothing_after_its_step(obs)) is not None:
        f.rank = stopped
        f.rules.append(f"every rank's log stops at step {quiet.last_step}, but rank {f.rank}"
                       " printed nothing after its last step line while every other rank"
                       " printed more: it stopped first")
    else:
        f.rules.append("every rank's log stops at the same step: which rank stopped first"
                       " is not known (stacks or a flight-recorder dump would say)")
    return True


def _printed_nothing_after_its_step(obs: list[Observation]) -> int | None:
    """The one rank whose last line of its own is its last step line, where every other
    rank printed a line after its own last step ("refreshed manifest" after step 30): the
    others got further. None where that is not exactly one rank."""
    last_lines = {(o.source.file, o.rank): o.source.line for o in obs
                  if o.what == "rank_line" and o.extra.get("last") and o.rank is not None}
    last_steps: dict[tuple[str, int | None], int] = {}
    for o in obs:
        if o.what == "step" and o.rank is not None and o.source.line is not None:
            key = (o.source.file, o.rank)
            last_steps[key] = max(last_steps.get(key, 0), o.source.line)
    if len(last_lines) < 2 or set(last_lines) != set(last_steps) \
            or len({file for file, _ in last_lines}) != 1:
        return None
    quiet = [rank for key in last_lines if last_lines[key] <= last_steps[key]
             for rank in (key[1],)]
    return quiet[0] if len(quiet) == 1 else None
