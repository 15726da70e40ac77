"""Where in the job the finding fell: its phase (the first of PHASE_RULES that places
it), its step window and the role of its rank."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from torchchaos.incident import frameworks, script_source
from torchchaos.incident.evidence import (
    ECHO,
    TEARDOWN_FOUND_NONE,
    save_interval,
    save_number,
    saves_in,
    saves_said_done,
    writer_rank,
)
from torchchaos.incident.finding import Finding, Incident, RankStory, say
from torchchaos.incident.launches import launch_order
from torchchaos.incident.observations import (
    Observation,
    Source,
    phase_of_frames,
    worker_of,
)


def place(obs: list[Observation], incident: Incident, later: list[Observation],
           sources: dict[str, list[str]]) -> None:
    """The phase, the step window and the role of the finding, each with its rule."""
    f = incident.finding
    told = f.step_window  # read off an artefact by the rule (a torn file's step)
    story = incident.ranks.get(f.rank) if f.rank is not None else None
    steps = sorted({o.step for o in obs if o.what == "step" and o.step is not None})
    last = story.last_step if story and story.last_step is not None else \
        (steps[-1] if steps else None)
    failed_at = _first_failure_line(obs, f)
    before = [s for o in obs if o.what == "step" and o.step is not None
              and (failed_at is None or earlier(o, failed_at)) for s in (o.step,)]
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
    if told[0] is not None:
        f.step_window = told
    logged = f.step_window[0]  # the last step the failure's own log reached
    # (an abort shows where the rank next used its group, which may be past the save the
    # restart resumed from: that save bounds the symptom, not when the group went)
    if logged is None and f.kind not in ("unknown", "abort"):
        _reached_before(f, later)
    if f.phase == "unknown":
        _phase(Placing(obs, incident, story, failed_at, later, sources, logged))
    if f.kind == "node" or f.node is not None and f.rank is None:
        f.role = "node"
    elif f.rank is not None:
        writer = writer_rank(obs)
        f.role = "writer" if f.rank == (writer or 0) else "other"
        if writer is None:
            f.rules.append("rank 0 is taken as the rank that writes checkpoints: the log"
                           " names no other")
    again = incident.restart_failure
    if again is not None and again.rank is not None:
        again.role = "writer" if again.rank == (writer_rank(obs + later) or 0) else "other"
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
        first = min(told, key=lambda o: (launch_order(o.source.file), o.source.line or 0))
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


@dataclass
class Placing:
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
        done = [o.source for o in saves_said_done(self.obs, at.file)
                if o.source.line is not None and o.source.line < at.line]
        return done[0] if done else None


def _phase(placing: Placing) -> None:
    """The first rule of PHASE_RULES that places the finding decides (the last always
    does)."""
    next(rule for rule, _why in PHASE_RULES if rule(placing))


def _aborted_before_its_teardown(p: Placing) -> bool:
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


def _in_own_frames(p: Placing) -> bool:
    """The failing rank's own frames were in a save or a load."""
    f, story = p.finding, p.story
    if not (story and story.phase in ("save", "load")):
        return False
    f.phase, f.phase_seen = {"save": "mid_save", "load": "load"}[story.phase], True
    f.rules.append(f"phase {f.phase}: rank {story.rank} was in {story.frame}")
    return True


def _temporary_file_left(p: Placing) -> bool:
    """A save's temporary file is still in the checkpoint folder."""
    temp = [o for o in p.obs if o.what == "checkpoint" and o.extra.get("temp")]
    if not temp:
        return False
    p.finding.phase, p.finding.phase_seen = "mid_save", True
    p.finding.rules.append(f"phase mid_save: {temp[0].source} is {temp[0].detail}")
    return True


def _checkpoint_does_not_load(p: Placing) -> bool:
    """A checkpoint file does not load: cut short by a death in its save (a hang leaves
    none, so one there is older than the hang)."""
    torn = [o for o in p.obs if o.what == "checkpoint" and o.extra.get("loads") is False]
    if not torn or p.finding.kind == "hang":
        return False
    p.finding.phase, p.finding.phase_seen = "mid_save", True
    p.finding.rules.append(f"phase mid_save: {torn[0].source} does not load"
                           f" ({torn[0].detail})")
    return True


def _save_left_open(p: Placing) -> bool:
    return p.finding.kind != "hang" and _save_the_log_left_open(p.obs, p.finding,
                                                                p.failed_at, p.later, p.logged)


def _resumed_without_a_step(p: Placing) -> bool:
    """The log's last resume before the failure has no step after it: the failure came
    in the load or right after it."""
    obs, failed_at, f = p.obs, p.failed_at, p.finding
    resumes = [o for o in obs if o.what == "resume" and (failed_at is None
                                                         or earlier(o, failed_at))]
    if not resumes:
        return False
    if any(o.what == "step" and earlier(resumes[-1], o.source)
           and (failed_at is None or earlier(o, failed_at)) for o in obs):
        return False
    f.phase, f.phase_seen = "after_resume", True
    f.rules.append(f"phase after_resume: it failed after {resumes[-1].source} resumed and"
                   " before any step was logged")
    return True


def _where_peers_waited(p: Placing) -> bool:
    # the failing rank's own frames, where they tell a phase, say more than its peers'
    return not (p.story and p.story.phase) and _peers_waiting(p.obs, p.finding, p.sources)


def _in_a_collective(p: Placing) -> bool:
    """The failing rank was in a collective, or the job hung: a training step's."""
    f, story = p.finding, p.story
    if not (story and story.phase == "collective" or f.kind == "hang"):
        return False
    f.phase, f.phase_seen = "between_saves", story is not None and story.phase is not None
    f.rules.append("phase between_saves: in a collective of a training step"
                   if f.phase_seen else "phase between_saves: a hang in a training step")
    return True


def _nothing_failed(p: Placing) -> bool:
    if p.finding.kind != "unknown":
        return False
    p.incident.unknowns.append("no failure is told, so none is placed: the artefacts show"
                               " no death, error, timeout or vanished launch")
    p.finding.step_window = (None, None)  # the last step of a run that may have finished
    return True


def _no_step_before(p: Placing) -> bool:
    f = p.finding
    if f.step_window[0] is not None or p.saved_before is not None:
        return False
    f.phase = "unknown"
    p.incident.unknowns.append(f"the phase of the {f.kind} is not known: no frame, no"
                               " checkpoint leftover and no step before it in the"
                               " artefacts")
    return True


def _between_saves_by_rule(p: Placing) -> bool:
    f = p.finding
    f.phase, f.phase_seen = "between_saves", False
    saved = p.saved_before if f.step_window[0] is None else None
    before = f"step {f.step_window[0]} came before it" if saved is None else \
        f"the log said a save was done before it ({saved}; no step line)"
    f.rules.append(f"phase between_saves by rule: no frame of the {f.kind} is known, no"
                   f" save was left unfinished, and {before}")
    return True


# The phase rules, in the order they are tried, each with why it comes where it does:
# what the failing rank was seen doing, then what the checkpoint folder and the log
# left, then where its peers waited; the last places it by rule.
PHASE_RULES: tuple[tuple[Callable[[Placing], bool], str], ...] = (
    (_aborted_before_its_teardown, "an abort found only at the rank's teardown says nothing"
                                   " of when the group went: no other rule may place it"),
    (_in_own_frames, "the failing rank's own frames in a save or a load are the phase seen"),
    (_temporary_file_left, "a save's temporary file left behind: a save under way"),
    (_checkpoint_does_not_load, "a file cut short by the death (not by a hang, which"
                                " writes nothing)"),
    (_save_left_open, "a save the log began and did not say done, or one the restart"
                      " did not find"),
    (_resumed_without_a_step, "a resume with no step after it: the load, or right after"),
    (_where_peers_waited, "where the surviving ranks waited, read in the script's lines:"
                          " after the failing rank's own evidence, which says more"),
    (_in_a_collective, "a collective of a training step, or a hang"),
    (_nothing_failed, "no failure told: none is placed"),
    (_no_step_before, "no step, save or frame before it: said unknown, not placed"),
    (_between_saves_by_rule, "the rest: between saves, said as placed by rule"),
)


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
    done, pending = saves_in([o for o in obs if earlier(o, failed_at)], failed_at.file) \
        if failed_at is not None else ([], None)
    said_done = max((step for step, _ in done), default=None)
    if said_done is not None and pending is not None:
        f.phase, f.phase_seen = "mid_save", True
        f.save = save_number(pending.step, interval)
        f.rules.append(f"phase mid_save: {pending.source} began the save of step"
                       f" {pending.step}, and the log, which says when a save is done, did"
                       " not say so before the failure")
        return True
    first_resume = _restart_resume(
        later, [o for o in obs if failed_at is not None and not earlier(o, failed_at)])
    if first_resume is None or reached is None:
        return False
    due = (reached // interval) * interval if interval else None
    if due is not None and first_resume.step < reached and due > first_resume.step \
            and (said_done is None or said_done < due):  # a save said done was lost instead
        f.phase, f.phase_seen, f.save = "mid_save", True, save_number(due, interval)
        f.rules.append(f"phase mid_save: the log reached step {reached}, checkpoints come every"
                       f" {interval} steps, yet the restart resumed from step"
                       f" {first_resume.step} ({first_resume.source}): the save of step {due}"
                       " never finished")
        return True
    if said_done is not None and first_resume.step == reached and said_done < reached:
        f.phase, f.phase_seen = "mid_save", True
        f.save = save_number(first_resume.step, interval)
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
        f.save = save_number(first_resume.step, interval)
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
    say(f, f"phase {phase}: {why}", peer)
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


def earlier(o: Any, where: Any) -> bool:
    src = o.source if isinstance(o, Observation) else o
    if src.file != where.file and worker_of(src.file) and not worker_of(where.file):
        # a worker's own file (torchrun --log-dir) in the first failure's view ended
        # with that failure, which the launcher's log tells after it
        return True
    if src.line is None or where.line is None or src.file != where.file:
        return launch_order(src.file) < launch_order(where.file) if src.file != where.file else True
    return src.line < where.line
