"""Observations to an incident: what each rank did, which fault started it, in which phase.

Every conclusion names its rule and the lines it stands on. The import runs in four
steps, each in a module of its own:

1. `normalise`: ranks given where a pid or the launcher's other workers tell them, a
   relaunch that started over said so, a resume's step taken from what it names.
2. `launches`: the logs cut into launches; the rules read the launch where the first
   failure shows (and what no launch holds), the restart's failure is read from the rest.
3. `rules.FAILURE_RULES`: the failure rules, in the order they are tried (the first
   that applies wins), each with why it comes where it does.
4. `placement.PHASE_RULES`: the phase rules, in order; then the step window and the
   rank's role.

The finding's model (`Finding`, `RankStory`, `Incident`) is in `finding`.
"""

from __future__ import annotations

import re

from torchchaos.incident.evidence import (
    BAD_DATA,
    a_load_error,
    is_failure,
    own_errors,
    save_interval,
)
from torchchaos.incident.finding import (  # noqa: F401  (the model, as callers import it)
    KINDS,
    LOADER_WAIT,
    PHASES,
    Finding,
    FirstFailure,
    Incident,
    RankStory,
    RestartFailure,
)
from torchchaos.incident.formats.batch_script import from_command_line
from torchchaos.incident.launches import (
    first_failure,
    launch_order,
    relaunch_of,
    restart_count,
    restarted,
    same_folder,
    vanished_launch,
)
from torchchaos.incident.normalise import (
    complete_pids,
    resume_steps,
    started_over,
    stories,
    with_ranks,
)
from torchchaos.incident.observations import Observation
from torchchaos.incident.placement import place
from torchchaos.incident.rules import first_rule_that_applies


def attribute(observations: list[Observation],
              sources: dict[str, list[str]] | None = None) -> Incident:
    """The incident `observations` tell; `sources` (the script files their tracebacks
    quote, from `gather`) let a silent script's peers say where its failure fell."""
    everything = resume_steps(started_over(with_ranks(observations)))
    stopped = {o.pid for o in everything if o.reason == "stopped by the launcher" and o.pid}
    obs, later = first_failure(everything, stopped)
    vanished = vanished_launch(obs)
    if vanished is not None:  # that launch's end is the first failure, its relaunch later
        relaunched = [o for o in obs if relaunch_of(vanished[0], o.source.file)]
        obs, later = [o for o in obs if o not in relaunched], relaunched + later
    obs = complete_pids(obs)
    ranks = stories(obs, stopped)
    for rank in {o.rank for o in everything if o.rank is not None} - set(ranks):
        ranks[rank] = RankStory(rank)  # seen only later: still a rank of the job
    finding = Finding()
    failure = FirstFailure(obs, stopped, ranks, finding, vanished=vanished)
    first_rule_that_applies(failure)
    incident = Incident(finding, ranks)
    ended = next((src[:-4] for src in finding.sources if src.endswith(":end")), None)
    if ended is not None:  # a launch that vanished: what came after is the next launch's
        later = [o for o in everything if launch_order(o.source.file) > launch_order(ended)
                 and same_folder(o.source.file, ended)]
    if failure.consequence is not None:  # the launch it failed in is the restart
        log = failure.consequence.source.file
        later = [o for o in obs if o.source.file == log] + later
    incident.recovery, incident.restart_failure = _recovery(later, stopped, obs)
    incident.restarts = restart_count(everything)
    incident.resumed = [f"{o.detail} ({o.source})" for o in everything if o.what == "resume"]
    incident.checkpoints = [f"{o.source}: {o.detail}" for o in everything
                            if o.what == "checkpoint"
                            and (o.extra.get("loads") is False or o.extra.get("temp"))]
    incident.world_size = max(ranks) + 1 if ranks else None
    incident.save_interval = save_interval(obs + later)
    incident.script = _script(obs) or _script(later)
    place(obs, incident, later, sources or {})
    return incident


# -- the restart after the first failure ---------------------------------------------------

def _first_sentence(text: str, limit: int = 160) -> str:
    end = text.find(". ", 40)
    cut = text[:end + 1] if 0 < end < limit else text[:limit]
    return cut + ("..." if len(cut) < len(text) and not cut.endswith(".") else "")


def _recovery(later: list[Observation], stopped: set[int | None],
              obs: list[Observation]) -> tuple[str, RestartFailure | None]:
    # the first error the log printed (the launcher's summary repeats one, later)
    errors = sorted(own_errors(later), key=lambda o: (launch_order(o.source.file),
                                                        o.source.line or 1e9))
    resumed = [o for o in later if o.what == "resume"]
    if errors:
        e = errors[0]
        loading = a_load_error(e)
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
    if restarted(later, obs):
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
    failed = {o.rank for o in obs if o.rank is not None and is_failure(o, stopped)
              and o.what == "exit"}
    return failed.pop() if len(failed) == 1 else None


def _script(obs: list[Observation]) -> str | None:
    """The script's file name: as torchrun's summary heads it ("train.py FAILED"), else
    the command line py-spy shows, else the file of a traceback's `<module>` frame."""
    named = [o.extra.get("script") for o in obs if o.extra.get("script")]
    for o in obs:
        if found := from_command_line(o.extra.get("command", "")):
            named.append(found[0])
    for o in obs:
        named += [m.group(1) for frame in o.frames[:1]
                  if (m := re.match(r"<module> \(([^:]+\.py):\d+\)", frame))]
    return named[0].rsplit("/", 1)[-1] if named else None  # a batch script's is a path
