"""Which saves a crash-state sweep covers by default: one of each shape the job shows.

A save's bugs depend on what it does to what was there before. The 2nd save is the
first with a checkpoint to fall back to, but a job that keeps its two newest
checkpoints deletes nothing before its 3rd save, and "prune before the new one is in
place" and "delete by name order" bugs live only in a save that deletes. So the
reference run's file operations (every rank's, from the agent) sort each save into
shapes:

- creates: it makes names no earlier save made;
- replaces: it writes over, or renames onto, a name an earlier save made;
- deletes: it removes a name an earlier save made (a temporary file the save itself
  made and removed is no deletion).

`choose` takes, from the 2nd save on, the first save of each shape, and says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from torchchaos.rundir.history import Event, History

SHAPES = ("creates", "replaces", "deletes")
WRITES = ("open", "write", "rename", "replace")


@dataclass(frozen=True)
class ChosenSave:
    save: int
    why: str  # "the first that deletes (removes ckpt/step_5.pt)"


def shapes(history: History) -> dict[int, dict[str, str]]:
    """Save number -> {shape: an example path}, over the first launch's saves."""
    found: dict[int, dict[str, str]] = {}
    for save, event, shape in _walk(history):
        own = found.setdefault(save, {})
        if shape is not None and (shape not in own or event["op"] in ("rename", "replace")):
            own[shape] = event["path"]  # a published name shows it best
    return found


def deletions(history: History, save: int) -> list[Event]:
    """The file events of save `save` that removed a name an earlier save made."""
    return [e for s, e, shape in _walk(history) if s == save and shape == "deletes"]


def _walk(history: History) -> Iterator[tuple[int, Event, str | None]]:
    """Every file event of the first launch's saves, with the shape it gives its save
    (None: a write to a name this save already wrote, a removal of its own name)."""
    on_disk: dict[str, int] = {}  # a name the agent saw written -> the save that wrote it
    for save, events in sorted(_by_save(history).items()):
        for e in events:
            path, shape = e["path"], None
            if e["op"] in WRITES:
                if on_disk.get(path) != save:  # the first this save does to the name
                    shape = "creates" if path not in on_disk else "replaces"
                on_disk[path] = save
            elif e["op"] == "remove":
                gone = [p for p in on_disk if p == path or p.startswith(path.rstrip("/") + "/")]
                if any(on_disk[p] < save for p in gone):
                    shape = "deletes"
                for p in gone:
                    del on_disk[p]
            yield save, e, shape


def choose(history: History) -> tuple[list[ChosenSave], list[str]]:
    """From the 2nd save on, the first save of each shape (in save order, each once),
    among the saves a step follows (a recording runs to the step after its save, and a
    crash in the job's last save leaves nothing to recover into); and a line for each
    shape only such a last save shows. Nothing where the job made no 2nd save."""
    found = shapes(history)
    reasons: dict[int, list[str]] = {}
    notes = []
    for shape in SHAPES:
        usable, last = _first(history, found, shape)
        if usable is not None:
            reasons.setdefault(usable, []).append(f"{shape} ({found[usable][shape]})")
        elif last is not None:
            notes.append(f"save {last} is the first that {shape}, but it is the job's last:"
                         " no step follows it to recover into; give the job more steps to"
                         " crash in it")
    chosen = [ChosenSave(save, "the first that " + " and ".join(why))
              for save, why in sorted(reasons.items())]
    return chosen, notes


def first_save_that(history: History, shape: str) -> int | None:
    """The first save from the 2nd on that has `shape` and a step after it, if any."""
    return _first(history, shapes(history), shape)[0]


def _first(history: History, found: dict[int, dict[str, str]],
           shape: str) -> tuple[int | None, int | None]:
    """The first save from the 2nd on with `shape` that a step follows; else the last
    save, where only it has the shape."""
    final = history.final_step()
    ends = {e["save"]: e["after_step"] for e in history.of("save_begin")
            if e.get("launch", 0) == 0 and e.get("after_step") is not None}
    saves = [s for s in sorted(found) if s >= 2 and shape in found[s]]
    usable = [s for s in saves if ends.get(s, final) < final]
    if usable:
        return usable[0], None
    return None, saves[0] if saves else None


def _by_save(history: History) -> dict[int, list[Event]]:
    saves: dict[int, list[Event]] = {}
    for e in sorted(history.of("file"), key=lambda e: e["t"]):
        if e.get("launch", 0) == 0 and e.get("save") and e.get("path"):
            saves.setdefault(e["save"], []).append(e)
    return saves
