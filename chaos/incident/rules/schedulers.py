"""Failure rules for what ended the job from outside its ranks: a preemption, a node a
scheduler says failed, a launch that vanished and a save lost with it."""

from __future__ import annotations

import re

from torchchaos.incident.evidence import saves_in, saves_said_done, stepped_first
from torchchaos.incident.finding import Finding, FirstFailure, say
from torchchaos.incident.observations import (
    Observation,
    worker_of,
)
from torchchaos.incident.rules.deaths import signal_death
from torchchaos.incident.rules.hangs import silence_before_the_time_limit


def preempt(c: FirstFailure) -> bool:
    """A rank ended by a SIGTERM (or exit 143) the launcher did not send, a handler's
    word that it got one, or a scheduler that says it preempted the job or ended it at
    its time limit."""
    obs, stopped, f = c.obs, c.stopped, c.finding
    deaths = [o for o in signal_death(obs, stopped, ("SIGTERM",)) if not _torn_down(o, obs)]
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
    said = stepped_first(said, obs)
    # a rank's death or its own word first, else the scheduler's reason, else torchrun's
    first = (deaths or [o for o in caught if o.rank is not None] or said or caught)[0]
    f.kind, f.rank, f.how, f.node = "preempt", first.rank, "SIGTERM", first.extra.get("node")
    who = f"rank {first.rank}" if first.rank is not None else "the job"
    if first in caught and first.extra.get("launcher"):
        say(f, f"preempt: torchrun got a SIGTERM from outside and stopped its workers"
                f" ({first.source})", first)
    elif first in caught:
        say(f, f"preempt: {who} said it got a SIGTERM ({first.detail[:80]!r}), and no"
                f" launcher line before it sent one ({first.source})", first)
    elif first in said and first.what == "job_state":
        say(f, f"preempt: the scheduler says it ended the job ({first.detail},"
                f" {first.source}): a SIGTERM to every task, then a SIGKILL", first)
    elif first in said:
        say(f, f"preempt: the scheduler says it preempted the job ({first.detail},"
                f" {first.source})", first)
    else:
        say(f, f"preempt: {who} ended by SIGTERM the launcher did not send"
                f" ({first.source})", first)
    _a_hang_not_ruled_out(obs, f)
    return True


def _a_hang_not_ruled_out(obs: list[Observation], f: Finding) -> None:
    """A time limit ends a job whose ranks had stopped as it ends one still training:
    where nothing times the silence before it (step lines with no time) and no stack or
    timeout told a hang, both kinds fit, and are said so."""
    ended = any(o.what == "job_state" and o.reason == "TIMEOUT" for o in obs)
    if ended and silence_before_the_time_limit(obs) is None:
        f.alternatives = ["hang"]
        f.alternatives_why = ("the scheduler's time limit ends a job that had stopped"
                              " progressing as it ends one still training; no timestamped"
                              " step line, stack or flight-recorder dump says which")
        if f.rank is None:
            f.rules.append("were it a hang, which rank stopped is not known: no artefact"
                           " says which rank's progress ended first")


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


def node_said(c: FirstFailure) -> bool:
    """A scheduler or operator that says a node failed: the peers' timeouts, lost
    connections and the signals that ended the job after it are its echoes."""
    obs, f = c.obs, c.finding
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
    say(f, f"node: {first.detail or first.reason} ({first.source})", first)
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


def launch_vanished(c: FirstFailure) -> bool:
    """A launch that vanished: its log ends with no failure and no success, and a later
    launch took over."""
    obs, f = c.obs, c.finding
    if c.vanished is None:
        return False
    ended, after = c.vanished
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
    elif after.what == "error":
        _saved_file_lost(obs, ended, after, f)
    return True


def _saved_file_lost(obs: list[Observation], ended: str, failed: Observation,
                     f: Finding) -> None:
    """A node that vanished after its log said a save was done and went on training, and
    a relaunch that died reading a file of that save which does not load now: the save
    had finished, and what it wrote was lost with the node (never made durable), as a
    power loss loses it; no death inside a save cut it short."""
    done = {step for step, _ in saves_in(obs, ended)[0]}
    torn = [o for o in obs if o.what == "checkpoint" and o.extra.get("loads") is False
            and not o.extra.get("temp") and o.step in done]
    trained_on = [o for o in obs if o.what == "step" and o.source.file == ended
                  and o.step is not None and torn and o.step > torn[0].step]
    if not torn or not trained_on:
        return
    lost = torn[0]
    f.kind, f.how, f.alternatives = "power_loss", "a finished save lost with the node", ["node"]
    f.alternatives_why = ("a node's death alone keeps what a finished save wrote, unless"
                          " the file was cut short by something else after the save")
    f.phase, f.phase_seen = "between_saves", True
    say(f, f"power_loss: {ended} says the save of step {lost.step} was done and trained on to"
           f" step {max(o.step or 0 for o in trained_on)}, yet {lost.source} {lost.detail}"
           f" and {failed.source} died reading the checkpoint: what the save wrote did not"
           " survive the node (never made durable: no fsync of it or its folder)", lost,
           failed)
    f.rules.append(f"phase between_saves: the log went on training after the save of step"
                   f" {lost.step} was done, and began no other")


def _lost_save(obs: list[Observation], ended: str, resume: Observation, f: Finding) -> None:
    """A node that vanished after its log said a checkpoint was saved, and a restart that
    resumed from an older one or found none: the finished save did not survive, as a
    power loss drops what was never made durable (a killed process's writes stay in the
    page cache)."""
    done, pending = saves_in(obs, ended)
    start = 0 if resume.what == "no_checkpoint" else resume.step
    if done and start is not None:
        step, last = max(done, key=lambda d: d[0])
        if start >= step:
            return
    elif resume.what == "no_checkpoint":  # any save said done, whatever step it was of
        said = saves_said_done(obs, ended)
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
    say(f, f"power_loss: {last.source} says {saved} was saved,"
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
