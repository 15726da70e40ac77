"""Failure rules that stand on the checkpoint folder: a torn file a resume died reading,
and a file that does not load where no death is in the artefacts."""

from __future__ import annotations

from torchchaos.incident.evidence import a_load_error, own_errors, writer_rank
from torchchaos.incident.finding import FirstFailure, say
from torchchaos.incident.formats import checkpoints
from torchchaos.incident.observations import Observation


def torn_checkpoint_read(c: FirstFailure) -> bool:
    """A resume that died loading a checkpoint the folder shows cut short: the failure is
    the save that left it so (a write torn by a death nobody logged: its launch's log is
    not among the artefacts, or ended with the node); the load's error is its
    consequence, the restart's failure, and not a fault of its own."""
    obs, f = c.obs, c.finding
    torn = [o for o in obs if o.what == "checkpoint" and o.extra.get("loads") is False
            and not o.extra.get("temp")]
    loads = [o for o in own_errors(obs) if a_load_error(o)]
    if not torn or not loads:
        return False
    error = next((o for o in loads if o.rank is not None), loads[0])
    file, why = _the_file_read(error, torn, obs)
    f.kind, f.phase, f.phase_seen, f.role = "torn_write", "mid_save", True, "writer"
    f.rank = file.rank if file.rank is not None else writer_rank(obs)
    f.how = f"{file.source.file.rsplit('/', 1)[-1]} cut short"
    f.step_window = (file.step, None)
    f.alternatives = ["kill", "node", "power_loss"]
    f.alternatives_why = ("a save cut short leaves the file so whatever ended it: a kill, a"
                          " node's loss, a power loss; no artefact of the launch that saved it"
                          " says which")
    say(f, f"torn_write: {file.source} {_sized(file, obs)}; {why}, and the resume died"
           f" loading it ({error.detail[:100]!r}, {error.source}): the save of step"
           f" {file.step} was cut short, and the load's error is its consequence", file, error)
    c.consequence = error
    return True


def _the_file_read(error: Observation, torn: list[Observation],
                   obs: list[Observation]) -> tuple[Observation, str]:
    """The torn file the failed load read: the one its error names, else the one the
    writer's pointer names, else the newest."""
    text = " ".join([error.detail, *error.frames])
    named = [o for o in torn if o.source.file.rsplit("/", 1)[-1] in text]
    if named:
        return named[0], "the error names it"
    pointed = {o.extra.get("target"): o for o in obs if o.what == "pointer"}
    for o in torn:
        pointer = pointed.get(o.source.file)
        if pointer is not None:
            return o, f"{pointer.source} points at it"
    newest = max(torn, key=lambda o: o.step or -1)
    return newest, "it is the newest checkpoint that does not load"


def _sized(file: Observation, obs: list[Observation]) -> str:
    """The torn file's problem and size, and a sibling of another step's size."""
    size = file.extra.get("size")
    shape = [o for o in obs if o.what == "checkpoint" and o.extra.get("loads")
             and o.step != file.step and o.extra.get("size")
             and checkpoints.sibling_key(o) == checkpoints.sibling_key(file)]
    sibling = f"; {shape[-1].source.file.rsplit('/', 1)[-1]} of step {shape[-1].step} is" \
              f" {shape[-1].extra['size']:,}" if shape else ""
    return f"is {size:,} bytes, {file.detail}{sibling}" if size is not None else file.detail


def checkpoint_only(c: FirstFailure) -> bool:
    """A checkpoint file that does not load, and no death in the artefacts."""
    obs, f = c.obs, c.finding
    bad = [o for o in obs if o.what == "checkpoint" and o.extra.get("loads") is False]
    if not bad:
        return False
    f.kind, f.how = "torn_write", bad[0].detail
    say(f, f"torn_write: {bad[0].source} {bad[0].detail}; no death is in the artefacts",
        bad[0])
    return True
