"""Observations made whole before any rule reads them: ranks given where a pid or the
launcher's other workers tell them, a relaunch that started over said so, a resume's step
taken from the checkpoint it names, and each rank's story."""

from __future__ import annotations

import dataclasses

from torchchaos.incident.evidence import ECHO, PATH_WORD
from torchchaos.incident.finding import RankStory
from torchchaos.incident.formats import checkpoints
from torchchaos.incident.launches import launch_of, relaunch_of, same_folder, went_on_past
from torchchaos.incident.observations import (
    Observation,
    Source,
    telling_frame,
)


def with_ranks(observations: list[Observation]) -> list[Observation]:
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
    several = {f for f in logs if any(g != f and same_folder(f, g)
                                      and launch_of(g) == launch_of(f) for g in logs)}
    return [dataclasses.replace(o, rank=None) if o.what == "exit" and "local_rank" in o.extra
            and "root_cause" not in o.extra and not o.extra.get("global")
            and o.source.file in several else o for o in obs]


def started_over(obs: list[Observation]) -> list[Observation]:
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
            if later.source.file in told or not relaunch_of(first.source.file,
                                                              later.source.file) \
                    or theirs[:len(mine)] != mine or not went_on_past(first.source.file,
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


def resume_steps(obs: list[Observation]) -> list[Observation]:
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


def complete_pids(obs: list[Observation]) -> list[Observation]:
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


def stories(obs: list[Observation], stopped: set[int | None]) -> dict[int, RankStory]:
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
