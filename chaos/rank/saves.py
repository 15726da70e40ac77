"""Which checkpoint save a file event belongs to, also when saves run in a background thread.

A save is the file events one process makes for one checkpoint, numbered 1,
2, ... in that process. A synchronous save is simply the events between two
optimizer steps. Asynchronous checkpointing (torch.distributed.checkpoint's
`async_save`, or a writer thread of the target's own) writes from another
thread while training goes on, so the rules are:

- events of the training (main) thread open a save or continue the open one;
  a save made by the main thread alone ends when the next step begins;
- events of another thread open a new save, or continue the one that thread
  opened: the save stays open across steps while that thread writes;
- main-thread events after a background save's are its commit (publishing a
  pointer or manifest once the data is written) and join it; the save then
  ends when the next step begins;
- otherwise a background save ends when the next save opens, or at exit.

A rank may also go on past a save without a next step: a save on a scheduler's
signal, a barrier, and the process is ended before it gets further. The
script's own collective after a save the main thread is done with marks it
left (`left`): the events made until then are a save the rank went on from.

A writer thread that lives across saves (a queue's worker started before
training, a `ThreadPoolExecutor`'s) never hands over to another thread, so
its own I/O says where its next save begins:

- by the step the files belong to: a path that names a step where the open
  save's first path named its own (`global_step_12/` after `global_step_8/`,
  `model_12.pt` after `model_8.pt`: the same words, another number) is the
  next save's;
- by the files it publishes: a save writes each file once, so opening a file
  the open save already opened (`ckpt.pt.tmp` again) begins the next save.

Events are numbered in the order they happen, which is deterministic as long
as the target does not write from two threads at once (a correct async
protocol commits only after its writer finished).

`after_step` is the step whose state the save holds: for a thread started to
write one checkpoint (as `async_save` does) the step it was started in; for a
long-lived writer, the step its first path names where one of its numbers can
be that step (after the last save's, not after the current one, nearer the
current one: a writer that woke late is a step or a few behind), else the step
of its first event; for the main thread the step of the first event.
`last_step` is the step during which its last event happened: the gap between
the two is the commit latency an asynchronous checkpoint adds to the work a
failure can cost.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import Any

_NUMBER = re.compile(r"\d+")


@dataclass
class Save:
    number: int
    after_step: int | None
    writer: Any = None  # the background thread that opened it; None: the main thread
    events: int = 0
    last_step: int | None = None
    last_t: float | None = None  # when its last event was recorded: where it was over
    committed: bool = False  # main-thread events followed the background writer's
    step_key: StepKey | None = None  # where its writer's first path named its step
    opened: set[str] = field(default_factory=set)  # files its writer opened for writing
    left_at: int = 0  # how many of its events there were when the rank last went on from it


class SaveTracker:
    """Groups one process's file events into saves (see the module docstring)."""

    def __init__(self) -> None:
        self.count = 0
        self.open: Save | None = None
        self.last_after_step = 0  # the newest step a save so far holds
        self._writers: weakref.WeakSet[Any] = weakref.WeakSet()  # threads that opened a save

    def event(self, writer: Any, step: int | None, started_at: int | None = None,
              op: str = "", path: str = "") -> tuple[Save, Save | None]:
        """File one event `op` on `path` of `writer` (None: the main thread) made
        during `step`.

        `started_at` is the step the writer thread was started in. Returns the
        event's save and the save this event closed (a background save ends when
        another opens), if any.
        """
        closed = None
        save = self.open
        if writer is None:
            if save is None:
                save = self._begin(None, step)
            elif save.writer is not None:
                save.committed = True
        elif save is None or save.writer is not writer or self._next_save_of(save, op, path):
            closed = self.finish()
            # A thread started before training (step 0) is a long-lived writer.
            fresh = writer not in self._writers and bool(started_at)
            after = started_at if fresh else _named_step(path, self.last_after_step, step)
            save = self._begin(writer, after if after is not None else step)
            save.step_key = _step_key(path, save.after_step)
            self._writers.add(writer)
        if writer is not None and op == "open":
            save.opened.add(path)
        save.events += 1
        save.last_step = step
        return save, closed

    @staticmethod
    def _next_save_of(save: Save, op: str, path: str) -> bool:
        """Does this event of the open save's own writer begin its next save?"""
        if op == "open" and path in save.opened:
            return True  # a save writes each file once
        return save.step_key is not None and _names_another_step(path, save.step_key,
                                                                  save.after_step)

    def step_begins(self) -> Save | None:
        """A step begins: the save it ends, if any."""
        save = self.open
        if save is not None and (save.writer is None or save.committed):
            return self.finish()
        return None

    def left(self) -> Save | None:
        """The main thread went on (the script entered a collective): the open save it
        was done with, if it has events since the rank last went on from it."""
        save = self.open
        if save is None or (save.writer is not None and not save.committed):
            return None  # nothing open, or a writer thread still at it
        if save.left_at == save.events:
            return None
        save.left_at = save.events
        return save

    def finish(self) -> Save | None:
        """End the open save (at exit, or when another opens)."""
        save, self.open = self.open, None
        return save

    def _begin(self, writer: Any, after_step: int | None) -> Save:
        self.count += 1
        self.last_after_step = max(self.last_after_step, after_step or 0)
        self.open = Save(self.count, after_step, writer)
        return self.open



StepKey = tuple[tuple[str, ...], int]  # a path's first components, digits blanked; which number


def _numbers(text: str) -> list[int]:
    return [int(n) for n in _NUMBER.findall(text)]


def _blanked(parts: list[str]) -> tuple[str, ...]:
    return tuple(_NUMBER.sub("#", part) for part in parts)


def _named_step(path: str, low: int, step: int | None) -> int | None:
    """The step a long-lived writer's first path names: the largest of its numbers
    after the last save's step `low` and not after the current one (None: none can be).
    A writer that woke late is a step or a few behind, never half the run: a number in
    the lower half (a rank's folder, rank1/, in the first save) is no step."""
    if step is None:
        return None
    named = max((n for n in _numbers(path) if low < n <= step), default=None)
    return named if named is not None and 2 * named > step + low else None


def _step_key(path: str, after_step: int | None) -> StepKey | None:
    """Where `path` names `after_step`: the components up to the first that holds it,
    blanked, and which of that component's numbers it is (None: it names it nowhere)."""
    parts = path.split("/")
    for at, part in enumerate(parts):
        found = _numbers(part)
        if after_step is not None and after_step in found:
            return _blanked(parts[:at + 1]), found.index(after_step)
    return None


def _names_another_step(path: str, key: StepKey, step: int | None) -> bool:
    """Does `path` have the shape of the key's path, with another number where it
    named its step?"""
    prefix, which = key
    parts = path.split("/")[:len(prefix)]
    if _blanked(parts) != prefix:
        return False
    return _numbers(parts[-1])[which] != step
