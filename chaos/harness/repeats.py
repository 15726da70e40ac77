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

import re
from pathlib import Path

from torchchaos.rundir.heartbeat import Beat
from torchchaos.rundir.history import Event, History, read_a_checkpoint
from torchchaos.rundir.layout import RunLayout

ERROR_LINE = re.compile(r"\b\w+(Error|Exception)\b: ")
COLLATERAL = re.compile(r"Connection (reset|closed|refused)|Broken pipe|DistNetworkError")
# torchrun's own report that a rank failed (a command's, or a forked rank's: warmrun):
# an echo of the rank's error, never its cause
LAUNCHER_ECHO = re.compile(r"ChildFailedError|Process(Exited|Raised)Exception")
Attempt = tuple[int, int]  # (launch, attempt)


class RepeatWatch:
    """How each attempt of a run died, noted as its ranks exit."""

    def __init__(self, run_dir: Path, resumes_at_start: bool = False) -> None:
        self.layout = RunLayout(run_dir)
        # a crash state's recovery: every attempt, the first too, resumes a checkpoint
        self.resumes_at_start = resumes_at_start
        self.deaths: dict[Attempt, str | None] = {}  # None: it stepped, or a fault fired
        self.errors_seen: dict[int, int] = {}  # launch -> error lines its logs had

    def poll(self, exits: list[Beat]) -> str | None:
        """Why to stop the job now (its ranks in `exits` just exited), or None."""
        ended = sorted({b.attempt_key for b in exits} - set(self.deaths))
        if not ended:
            return None
        history = History.of_run(self.layout.run_dir)
        for attempt in ended:
            self.deaths[attempt] = self._death(history, attempt)
        attempts = sorted({(e["launch"], e["attempt"]) for e in history.of("boot")})
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
        return (f"the resume died twice in a row before its first step with the same error"
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
        errors = self._errors(attempt[0])
        new = errors[self.errors_seen.get(attempt[0], 0):]
        self.errors_seen[attempt[0]] = len(errors)
        causes = [e for e in new if not COLLATERAL.search(e)]
        return causes[-1] if causes else None

    def _errors(self, launch: int) -> list[str]:
        """The error lines the launch's nodes printed so far, in order."""
        found = []
        for log in sorted(self.layout.logs_dir.glob(f"launch-{launch}-node-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if ERROR_LINE.search(line) and not LAUNCHER_ECHO.search(line):
                    found.append(line.strip()[:300])
        return found


def _events_of(history: History, attempt: Attempt) -> list[Event]:
    """The ranks' events of `attempt`."""
    return [e for e in history.events
            if (e.get("launch"), e.get("attempt")) == attempt and "rank" in e]


def _first_line(message: str) -> str:
    return (message.splitlines() or [""])[0]
