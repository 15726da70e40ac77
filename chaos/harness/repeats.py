"""A resume that dies the same way twice: stop instead of waiting for every restart.

torchrun restarts the workers after a death (`--max-restarts`) and the harness
relaunches a job that died (`Scenario.max_relaunches`), as a cluster would. A
resume that raises before its first step, on a checkpoint folder that nothing
changes between attempts, raises again at every restart: the defaults (3
restarts, 3 relaunches) spend a minute and a half on a verdict the second death
already settled, and a CI timeout then leaves no report at all.

So once two attempts in a row, in which no fault fired, died before their first
step with the same error, the runner stops the job, says why in its history
(`gave_up`), and the run is judged as it stands. The error is the exception the
agent saw leave the script, or, for a script that catches it, prints it and
exits (most launchers do), the newest error line its launch printed since the
attempt before; a peer's lost connection is the echo of a death, never its
cause, and does not count.

A crash state's recovery stops sooner: it resumes from a folder nothing changes, and
the judge calls a resume that read the checkpoint and died before its first step a
failed resume whatever a restart does next (`Evidence.false_starts` excuses only a
death before any read). So there the first such death stops the job; a death before
any read (a port still held) is restarted as before. A sweep whose resumes fail
starts each of them once instead of twice.
"""

from __future__ import annotations

from pathlib import Path

from torchchaos.harness.errorlines import error_lines
from torchchaos.log_lines import COLLATERAL
from torchchaos.rundir.heartbeat import Beat
from torchchaos.rundir.history import Event, History, read_a_checkpoint
from torchchaos.rundir.layout import RunLayout

Attempt = tuple[int, int]  # (launch, attempt)


class RepeatWatch:
    """How each attempt of a run died, noted as its ranks exit."""

    def __init__(self, run_dir: Path, resumes_at_start: bool = False) -> None:
        self.layout = RunLayout(run_dir)
        # a crash state's recovery: every attempt, the first too, resumes a checkpoint
        self.resumes_at_start = resumes_at_start
        self.deaths: dict[Attempt, str | None] = {}  # None: it stepped, or a fault fired
        self.lines_seen: dict[str, int] = {}  # log name -> lines read from it so far
        # ended attempts whose words are not in the log yet: torchrun prints a rank's exit
        # status (the line a script's last words are read before) a poll or two after it
        self.pending: set[Attempt] = set()

    def poll(self, exits: list[Beat]) -> str | None:
        """Why to stop the job now (its ranks in `exits` just exited), or None."""
        ended = sorted(({b.attempt_key for b in exits} - set(self.deaths)) | self.pending)
        if not ended:
            return None
        history = History.of_run(self.layout.run_dir)
        attempts = sorted({(e["launch"], e["attempt"]) for e in history.of("boot")})
        for attempt in ended:
            self.pending.discard(attempt)
            self.deaths[attempt] = self._death(history, attempt)
            if self.deaths[attempt] is PENDING:  # until the next attempt boots
                self.deaths[attempt] = None
                if not attempts or attempt == attempts[-1]:
                    self.pending.add(attempt)
        last = ended[-1]
        if (self.resumes_at_start and (how := self.deaths.get(last))
                and read_a_checkpoint(_events_of(history, last))):
            return (f"the resume read the checkpoint and died before its first step ({how}),"
                    " no fault in it: a failed resume whatever a restart does, and the"
                    " harness stopped the job instead of restarting it")
        if last not in attempts or attempts.index(last) == 0:
            return None
        before = attempts[attempts.index(last) - 1]
        how = self.deaths.get(last)
        if how is None or how != self.deaths.get(before):
            return None
        who = "the resume" if read_a_checkpoint(_events_of(history, last)) else "the job"
        return (f"{who} died twice in a row before its first step with the same error"
                f" ({how}), no fault between: every restart would die so again, and the"
                " harness stopped the job instead of waiting for them")

    def _death(self, history: History, attempt: Attempt) -> str | None:
        """How `attempt` died before its first step: its error, or None where it stepped,
        a fault fired in it, or no new error was printed."""
        mine = _events_of(history, attempt)
        if any(e["ev"] in ("step", "fault") for e in mine):
            return None
        raised = sorted(f"{e['type']}: {_first_line(e.get('message', ''))}" for e in mine
                        if e["ev"] == "exception" and e.get("before_first_step"))
        raised = [r for r in raised if not COLLATERAL.search(r)]
        if raised:
            return raised[0]
        causes = [e for e in self._new_errors(attempt[0]) if not COLLATERAL.search(e)]
        return causes[-1] if causes else PENDING

    def _new_errors(self, launch: int) -> list[str]:
        """The error lines the launch's nodes printed since the last look that found one,
        in order: exceptions, argparse's refusal, and a rank's last line before torchrun
        says it exited with a status of its own (a `SystemExit`'s message). A clean exit
        has none, and its lines are looked at again with what comes after them."""
        found = []
        for log in sorted(self.layout.logs_dir.glob(f"launch-{launch}-node-*.log")):
            lines = log.read_text(errors="replace").splitlines()
            seen = self.lines_seen.get(log.name, 0)
            errors = [line[:300] for line in error_lines(lines[seen:])]
            if errors:
                self.lines_seen[log.name] = len(lines)
            found += errors
        return found


# `_death`'s word for an attempt that ended before its first step with no error in the
# log yet: looked at again at the next poll, while no newer attempt has booted
PENDING = "pending"


def _events_of(history: History, attempt: Attempt) -> list[Event]:
    """The ranks' events of `attempt`."""
    return [e for e in history.events
            if (e.get("launch"), e.get("attempt")) == attempt and "rank" in e]


def _first_line(message: str) -> str:
    return (message.splitlines() or [""])[0]
