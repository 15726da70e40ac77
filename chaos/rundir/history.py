"""The history: one JSONL stream per rank plus the harness's own.

Every event carries `t`, a `time.monotonic()` stamp; CLOCK_MONOTONIC is one
clock for the whole machine on Linux, so streams from different processes
merge into one order. Each event is written with a single `os.write` on an
O_APPEND descriptor: a process killed at any moment leaves at most one torn
last line, which the reader skips.

Every event's name and fields: `torchchaos.rundir.events`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchchaos.rundir.layout import RunLayout

Event = dict[str, Any]
# os.write as it is before a rank's I/O watch wraps it: the history is the harness's own
# file (never a checkpoint event), so its writes need not pass through the watch.
_write = os.write


class HistoryWriter:
    """Appends events to one stream; safe to use from several threads."""

    def __init__(self, path: Path, **fixed: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fixed = fixed
        self._fixed_json = "".join(f"{json.dumps(k)}: {json.dumps(v, default=str)}, "
                                   for k, v in fixed.items())

    def record(self, ev: str, **fields: Any) -> Event:
        event = {"ev": ev, "t": time.monotonic(), **self._fixed, **fields}
        _write(self._fd, (json.dumps(event, default=str) + "\n").encode())
        return event

    def record_step(self, step: int | None, aligned: bool, local: int, loss: float | None,
                    fp: dict[str, str], light: bool) -> None:
        """The `step` event, written once a step: the line `record` would write, made
        with one format instead of the JSON encoder (27 us instead of 47, measured in a
        training step). It relies on what a step's fields are: numbers, and fingerprints
        whose names and values are ASCII letters, digits, dots, pluses and minuses."""
        prints = ", ".join([f'"{name}": "{value}"' for name, value in fp.items()])
        tail = ', "light": true' if light else ""
        line = (f'{{"ev": "step", "t": {time.monotonic()!r}, {self._fixed_json}'
                f'"step": {_number(step)}, "aligned": {"true" if aligned else "false"}, '
                f'"local": {local}, "loss": {_number(loss)}, "fp": {{{prints}}}{tail}}}\n')
        _write(self._fd, line.encode())

    def close(self) -> None:
        os.close(self._fd)


def _number(value: int | float | None) -> str:
    """A number as `json.dumps` writes it (NaN and the infinities as it names them)."""
    if value is None:
        return "null"
    return repr(value) if math.isfinite(value) else json.dumps(value)


def read_a_checkpoint(events: Iterable[Event]) -> bool:
    """Do these events (an attempt's ranks') show a checkpoint read: a file loaded, or an
    exception raised after a load?"""
    return any(e["ev"] == "load" or (e["ev"] == "exception" and e.get("after_load"))
               for e in events)


def read_stream(path: Path) -> list[Event]:
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill
    return events


@dataclass
class History:
    """All events of one run, merged in time order."""

    events: list[Event] = field(default_factory=list)

    @classmethod
    def load(cls, history_dir: Path) -> History:
        events: list[Event] = []
        for path in sorted(history_dir.glob("*.jsonl")):
            events.extend(read_stream(path))
        events.sort(key=lambda e: e["t"])
        return cls(events)

    @classmethod
    def of_run(cls, run_dir: Path) -> History:
        return cls.load(RunLayout(run_dir).history_dir)

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e["ev"] in kinds]

    def steps(self, rank: int | None = None) -> list[Event]:
        return [e for e in self.of("step") if rank is None or e.get("rank") == rank]

    def ranks(self) -> list[int]:
        return sorted({e["rank"] for e in self.events if "rank" in e})

    def final_step(self) -> int:
        return max((e["step"] for e in self.steps()), default=0)

    def faults(self) -> list[Event]:
        return self.of("fault")

    def checkpoint_writer(self) -> int:
        """The rank that writes checkpoints: the lowest of those that saved the first
        checkpoint (0 if none). Not the one whose save began first: where every rank
        writes its part, which one starts first changes from run to run."""
        saves = self.of("save_begin")
        if not saves:
            return 0
        first = saves[0].get("after_step")
        return min(e["rank"] for e in saves if e.get("after_step") == first)

    def checkpoint_dir(self, save: int) -> str | None:
        """Where save `save` (of the first launch, on every rank) writes, as the folder of
        the run directory to mount the fault filesystem over: its top-level folder ("out"
        for out/ckpt/step-5.pt), "." for files directly in the run directory; None when
        its file events lie in several top-level folders or outside the run directory,
        or when it has none."""
        events = [e for e in self.of("file") if e.get("save") == save
                  and e.get("launch", 0) == 0 and e.get("path")]
        written_in = {Path(e["path"]).parts[0] for e in events if len(Path(e["path"]).parts) > 1}
        places = {_top_folder(e, written_in) for e in events}
        return places.pop() if len(places) == 1 else None

    def save_interval(self) -> int:
        """Steps between the first two checkpoint saves (0 with fewer than two)."""
        saves = self.of("save_begin")
        return saves[1]["after_step"] - saves[0]["after_step"] if len(saves) >= 2 else 0


def _top_folder(event: Event, written_in: set[str]) -> str | None:
    """The top-level folder of the run directory a file event lands in (None: outside).
    A name directly in the run directory is an entry of the run directory itself,
    except a folder the save writes in being made (makedirs) or made durable (fsync)."""
    path = Path(event["path"])
    if path.is_absolute() or not path.parts or path.parts[0] == "..":
        return None
    if len(path.parts) > 1:
        return path.parts[0]
    if event.get("op") in ("mkdir", "fsync") and path.parts[0] in written_in:
        return path.parts[0]
    return "."
