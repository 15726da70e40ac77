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

Events are numbered in the order they happen, which is deterministic as long
as the target does not write from two threads at once (a correct async
protocol commits only after its writer finished).

`after_step` is the step whose state the save holds: for a thread started to
write one checkpoint (as `async_save` does) the step it was started in,
otherwise (the main thread, a writer thread that lives across saves) the step
of the save's first event. `last_step` is the step during
which its last event happened: the gap between the two is the commit latency
an asynchronous checkpoint adds to the work a failure can cost.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any


@dataclass
class Save:
    number: int
    after_step: int | None
    writer: Any = None  # the background thread that opened it; None: the main thread
    events: int = 0
    last_step: int | None = None
    committed: bool = False  # main-thread events followed the background writer's


class SaveTracker:
    """Groups one process's file events into saves (see the module docstring)."""

    def __init__(self) -> None:
        self.count = 0
        self.open: Save | None = None
        self._writers: weakref.WeakSet[Any] = weakref.WeakSet()  # threads that opened a save

    def event(self, writer: Any, step: int | None, started_at: int | None = None
              ) -> tuple[Save, Save | None]:
        """File one event of `writer` (None: the main thread) made during `step`.

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
        elif save is None or save.writer is not writer:
            closed = self.finish()
            # A thread started before training (step 0) is a long-lived writer.
            fresh = writer not in self._writers and bool(started_at)
            save = self._begin(writer, started_at if fresh else step)
            self._writers.add(writer)
        save.events += 1
        save.last_step = step
        return save, closed

    def step_begins(self) -> Save | None:
        """A step begins: the save it ends, if any."""
        save = self.open
        if save is not None and (save.writer is None or save.committed):
            return self.finish()
        return None

    def finish(self) -> Save | None:
        """End the open save (at exit, or when another opens)."""
        save, self.open = self.open, None
        return save

    def _begin(self, writer: Any, after_step: int | None) -> Save:
        self.count += 1
        self.open = Save(self.count, after_step, writer)
        return self.open
