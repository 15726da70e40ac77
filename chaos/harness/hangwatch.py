"""The harness's own hang detector: no rank made progress for T seconds.

A synchronous job stalls as a whole: one stuck rank leaves every other rank
waiting inside a collective. So the job is hung when no live rank of the
current attempt has made progress (`torchchaos.rundir.heartbeat`) for `timeout` seconds.
Ranks that stopped on purpose (`Scenario.stop_after`) do not count.

Once a rank of the attempt has exited, the job has reacted (its watchdog or
collective timeout fired, or a rank crashed) and torchrun is tearing the
attempt down: it SIGTERMs the other workers and SIGKILLs them only after its
shutdown grace (30 s). That wait is recovery time, not a hang, so the bound
grows by the grace; an attempt still alive after both has hung in teardown.

A stall while a harness fault with a known end is in force (a partition
`for=` N seconds) is waiting, not hanging: the runner excuses it until the
fault heals (`excuse_until`), and the bound counts from then.

When every rank of the attempt has exited and no rank of a next one has
started for `timeout` seconds, the job is hung between attempts: torchrun
waits in its rendezvous for a node that cannot join (cut off for good) or
cannot start its workers. A restart takes seconds, so this too is a hang.

On a loaded machine a rank in a long step waits for a CPU much of the time: the bound
counts only the time a rank could have run (`torchchaos.host.cpuwait`), so load slows
the clock of a working rank and leaves a hung one's (not runnable) as the wall clock.

The detector only reads the beat files and the kernel's counts; the runner decides what
to do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchchaos.host.cpuwait import WaitSinceProgress
from torchchaos.host.procs import pid_stopped
from torchchaos.rundir.heartbeat import BEAT_SECONDS, Beat, current_attempt, read_beats
from torchchaos.rundir.history import History

TORCHRUN_SHUTDOWN_SECONDS = 30.0  # torchrun's grace between SIGTERM and SIGKILL of a worker
FROZEN_AFTER = 4 * BEAT_SECONDS  # no beat for this long: the rank runs no Python at all
# How likely each state is the cause of a hang, most likely first. "stuck" (beats, but is
# not inside a collective) is told apart from "waiting" once its stack is known.
STATE_ORDER = ("stopped", "frozen", "stuck", "waiting")


@dataclass
class RankState:
    rank: int
    pid: int
    step: int | None
    doing: str  # the rank's last progress
    idle_seconds: float  # since that progress
    state: str  # "stopped" (SIGSTOP), "frozen" (no heartbeat), "waiting" (beats, no progress)
    starting: bool = False  # no step begun yet in this process: importing, initialising

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": self.pid, "step": self.step, "doing": self.doing,
                "idle_seconds": round(self.idle_seconds, 1), "state": self.state}


@dataclass
class HangFinding:
    # since the job's last progress (or since a rank exited), less what the ranks
    # waited for a CPU meanwhile
    seconds: float
    ranks: list[RankState]  # the live ranks, the likely culprit first
    after_exit: list[int] = field(default_factory=list)  # ranks that had exited: teardown hung
    # every rank had exited and none of a next attempt started (`ranks` is empty)
    between_attempts: bool = False
    # every rank of the attempt had ended its training cleanly and was tearing down or
    # exiting (`torchchaos.rundir.heartbeat.AT_EXIT`): the work is done, the exit hung
    at_exit: bool = False

    @property
    def culprit(self) -> RankState:
        return self.ranks[0]

    @property
    def in_start_up(self) -> bool:
        """No rank of the attempt has begun a step: it is starting (or between attempts),
        where a slow machine looks like a stall (`torchchaos.host.busy`)."""
        return self.between_attempts or all(r.starting for r in self.ranks)


class HangWatch:
    def __init__(self, beats_dir: Path, timeout: float) -> None:
        self.beats_dir = beats_dir
        self.timeout = timeout
        self.seen_exits: set[int] = set()
        self.launched_at = 0.0
        self.excused_until = 0.0
        self.waits = WaitSinceProgress()

    def poll(self, now: float | None = None) -> tuple[list[Beat], HangFinding | None]:
        """Ranks of the current attempt that exited since the last poll (each once),
        and the hang, if the job is hung."""
        now = time.monotonic() if now is None else now
        beats = current_attempt(read_beats(self.beats_dir))
        live = [b for b in beats if b.alive()]
        gone = [b for b in beats if b not in live]
        exits = [b for b in gone if b.pid not in self.seen_exits]
        self.seen_exits.update(b.pid for b in exits)
        return exits, self._hang(live, gone, now)

    def launch_began(self, now: float | None = None) -> None:
        """The runner (re)launched the job: time before this is not the new launch's."""
        self.launched_at = time.monotonic() if now is None else now

    def excuse_until(self, t: float) -> None:
        """No progress before `t` counts: a timed fault is in force until then (the
        bound then counts from its heal, so an earlier `t` never takes that back)."""
        self.excused_until = max(self.excused_until, t)

    def _hang(self, live: list[Beat], gone: list[Beat], now: float) -> HangFinding | None:
        working = [b for b in live if not b.stopped]
        self.waits.keep_only({b.pid for b in working})
        if not working:
            return self._between_attempts(live, gone, now)
        # a rank's last progress, moved on by the time it since waited for a CPU
        since = max([b.progress_t + self._waited(b, now) for b in working]
                    + [self.excused_until])
        limit = self.timeout
        at_exit = all(b.at_exit for b in live + gone)
        if gone:
            since = max(since, max(b.beat_t for b in gone))
            if not at_exit:  # a rank that ended cleanly asks torchrun to tear nothing down
                limit += TORCHRUN_SHUTDOWN_SECONDS
        if now - since < limit:
            return None
        ranks = sorted((_state(b, now) for b in working), key=_culprit_order)
        return HangFinding(now - since, ranks, sorted(b.rank for b in gone), at_exit=at_exit)

    def _waited(self, beat: Beat, now: float) -> float:
        """Seconds the rank waited for a CPU since its last progress (never more than
        have passed since)."""
        return min(self.waits.seconds(beat.pid, beat.progress_t), now - beat.progress_t)

    def _between_attempts(self, live: list[Beat], gone: list[Beat],
                          now: float) -> HangFinding | None:
        if live or not gone:  # ranks stopped as asked, or none started yet
            return None
        since = max([b.beat_t for b in gone] + [self.launched_at, self.excused_until])
        if now - since < self.timeout:
            return None
        # every rank ended its training and exited; what waits is torchrun itself
        return HangFinding(now - since, [], sorted(b.rank for b in gone), between_attempts=True,
                    at_exit=all(b.at_exit for b in gone))


def _state(beat: Beat, now: float) -> RankState:
    if pid_stopped(beat.pid):
        state = "stopped"
    elif now - beat.beat_t > FROZEN_AFTER:
        state = "frozen"
    else:
        state = "waiting"
    return RankState(beat.rank, beat.pid, beat.step, beat.doing, now - beat.progress_t, state,
                     starting=not beat.trained)


def _culprit_order(rank: RankState) -> tuple[int, float, int]:
    """Stopped, then frozen ranks first; then the one idle longest (it stalled first)."""
    return (STATE_ORDER.index(rank.state), -rank.idle_seconds, rank.rank)


MIN_TIMEOUT = 10.0  # seconds: the default bound, for jobs whose steps take well under it
REFERENCE_TIMEOUT = 60.0  # the reference run's bound when none is given (steps unknown yet)
OWN_TIMEOUT_SLACK = 1.5  # a job's own collective timeout, and half again for its restart
PROGRESS_EVENTS = ("boot", "restore", "step", "file", "load", "save_begin", "save_end")


def default_timeout(reference: History) -> float:
    """The chaos run's bound: 10 s, or 3x the longest the fault-free run ever went
    without progress on a rank, or the collective timeout the job set itself and half
    as long again (for it to fire, reach torchrun and restart the job), whichever is
    longest. Start-up counts twice over: from a rank's boot to its first step, and
    from a launch to its ranks' boot (torchrun and the workers importing torch): a
    restart between attempts pays the latter again, and on a loaded machine that alone
    can take 10 s (it is progress, not a hang). A job that kept torch's default
    collective timeout (30 minutes on gloo) set none: its hangs are bound by the rest."""
    by_pid: dict[int, list[float]] = {}
    for event in reference.of(*PROGRESS_EVENTS):
        by_pid.setdefault(event["pid"], []).append(event["t"])
    gaps = [b - a for times in by_pid.values() for a, b in zip(times, times[1:])]
    own = max((e["collective_timeout"] for e in reference.of("restore")
               if e.get("collective_timeout")), default=0.0)
    return max(MIN_TIMEOUT, 3 * max(gaps + _start_ups(reference), default=0.0),
               OWN_TIMEOUT_SLACK * own + 2.0)


def _start_ups(reference: History) -> list[float]:
    """Seconds from each launch of the job to the first boot of a rank after it."""
    launches = sorted(e["t"] for e in reference.of("launch"))
    boots = sorted(e["t"] for e in reference.of("boot"))
    return [next(b for b in boots if b >= t) - t for t in launches
            if any(b >= t for b in boots)]
