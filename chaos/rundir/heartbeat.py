"""Per-rank heartbeats: is each rank alive, and when did it last make progress?

The agent in every rank keeps a beat file (`_chaos/beats/rank-R.json`) that a
background thread rewrites twice a second with the time of the rank's last
*progress* (a step, the first forward of a step, a checkpoint file event, a
load) and the time of the beat itself. The two clocks answer different
questions: a rank blocked in a collective still beats but makes no progress;
a rank that is stopped (SIGSTOP) or holds the GIL in native code does not even
beat. The harness's hang detector (`torchchaos.harness.hangwatch`) and the hang fault's
healer read the files; nothing here waits on the rank.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from torchchaos.host.procs import pid_alive

BEAT_SECONDS = 0.5
# What a rank does once its training ended cleanly: in the script's
# destroy_process_group(), then in the interpreter's own exit. A hang there is a hang at
# exit (the work is done), told apart from a hang in training.
TEARDOWN = "teardown"
EXITING = "exiting"
AT_EXIT = (TEARDOWN, EXITING)
TRAINING = ("forward", "step")  # progress that only a rank past its start-up makes


@dataclass
class Beat:
    rank: int
    pid: int
    launch: int  # the runner's relaunch count
    attempt: int  # torchrun's restart count within the launch
    step: int | None  # global step completed last
    doing: str  # what the last progress was: "boot", "step", "forward", "save", "load", ...
    progress_t: float  # time.monotonic() of the last progress
    beat_t: float  # time.monotonic() of this beat
    stopped: bool = False  # stopped on purpose (Scenario.stop_after): waiting to be reaped
    trained: bool = False  # began a step in this process: past its start-up

    @property
    def at_exit(self) -> bool:
        return self.doing in AT_EXIT

    @property
    def attempt_key(self) -> tuple[int, int]:
        return self.launch, self.attempt

    def alive(self) -> bool:
        return pid_alive(self.pid)


class Heartbeat:
    """The writer, in a rank: `progress()` is cheap (no I/O); a daemon thread writes."""

    def __init__(self, path: Path, rank: int, launch: int, attempt: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        now = time.monotonic()
        self.beat = Beat(rank, os.getpid(), launch, attempt, None, "boot", now, now)
        self._last = ("boot", None, now)  # the last progress: doing, step, when
        self._write_lock = threading.Lock()

    def progress(self, doing: str, step: int | None) -> None:
        # Twice a training step: one assignment of a tuple, which the beat thread reads
        # whole (atomic under the GIL), instead of a lock taken from the training thread.
        self._last = (doing, step, time.monotonic())
        if doing in TRAINING:
            self.beat.trained = True

    def stopped(self) -> None:
        self.beat.stopped = True
        self.write()

    def start(self) -> None:
        self.write()
        threading.Thread(target=self._run, name="torchchaos-heartbeat", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(BEAT_SECONDS)
            if os.getpid() != self.beat.pid:  # a forked child: the beat is its parent's
                return
            self.write()

    def write(self) -> None:
        # One writer at a time: the beat thread and the main thread (at teardown) share
        # the temporary name, and two at once renamed it twice (the second found it gone,
        # and a rank that had finished its training died of FileNotFoundError). In order,
        # too: a beat taken earlier never lands over a later one.
        with self._write_lock:
            self.beat.doing, self.beat.step, self.beat.progress_t = self._last
            self.beat.beat_t = time.monotonic()
            data = json.dumps(asdict(self.beat)).encode()
            tmp = self.path.with_name(f".{self.path.name}.{self.beat.pid}")
            # a whole new file renamed over the old one: a reader never sees half a beat
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)


def read_beats(beats_dir: Path) -> list[Beat]:
    """The newest beat of every rank that has one."""
    beats = []
    known = {f.name for f in fields(Beat)}
    for path in sorted(beats_dir.glob("rank-*.json")):
        try:
            data = json.loads(path.read_text())
            beats.append(Beat(**{k: v for k, v in data.items() if k in known}))
        except (OSError, ValueError, TypeError):
            continue  # gone between the listing and the read
    return beats


def current_attempt(beats: list[Beat]) -> list[Beat]:
    """The beats of the newest attempt (the ranks a restart started last)."""
    if not beats:
        return []
    newest = max(b.attempt_key for b in beats)
    return [b for b in beats if b.attempt_key == newest]


def peers_gone(beats_dir: Path, pid: int) -> list[int]:
    """Ranks of the attempt `pid` belongs to whose processes have exited."""
    beats = read_beats(beats_dir)
    mine = next((b for b in beats if b.pid == pid), None)
    if mine is None:
        return []
    return [b.rank for b in beats
            if b.attempt_key == mine.attempt_key and b.pid != pid and not b.alive()]
