"""Nothing of a run outlives its harness, however the harness ends.

The first run a harness process starts (`own`) gives the process a lifeline:

- its lock file (`torchchaos.host.owners`), listing every run it starts;
- a watcher process holding the read end of a pipe whose only write end is
  the harness's, and a descriptor of the lock file. It is started through
  `setsid --fork`, so it belongs to no process group and no process tree of
  the harness: Ctrl-C on the terminal, a CI runner killing the job's tree or
  group, and the OOM killer's choice of the harness leave it alone.

When the harness ends (returns, raises, SIGKILL, OOM) the kernel closes the
write end; the watcher's `read` returns and it removes what still exists of
the listed runs — SIGKILL to every marked process (a SIGSTOPped rank dies
too), lazy unmounts, namespaces, links, bridge — then deletes the lock file.
It does not give up while a process of those runs is left (one stuck in the
kernel, one a stray parent keeps forking): it tries again, less and less
often, and says what survived in the lock file (`torchchaos clean` shows it
if the watcher dies too).
Nothing polls: training pays nothing, the watcher sleeps in read(2). While it
works its descriptor keeps the lock held, so no other harness takes those
runs for leftovers; if it is killed too, the lock is free and the next start
or `torchchaos clean` removes what is left.

Starting a lifeline first removes whatever dead harnesses left behind
(`sweep_stale`), once per process.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from torchchaos import env
from torchchaos.host import leftovers
from torchchaos.host.owners import HarnessLock, LockFile, note

OFF_ENV = "TORCHCHAOS_NO_LIFELINE"  # "1": no lock, no watcher, no sweep (benchmarks only)
ROUND_SECONDS = 10.0  # one round of the watcher's SIGKILLs; rounds go on while a process is left
PAUSES = (1.0, 2.0, 5.0, 10.0, 30.0)  # between rounds, then the last one again and again

_lock = threading.Lock()
# (pid, lifeline or None where it could not start): a forked child makes its own
_current: tuple[int, Lifeline | None] | None = None
Say = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"torchchaos: {message}", file=sys.stderr)


class Lifeline:
    """This process's lock file and watcher. The pipe's write end (`_write_end`) is held,
    never written, until the process ends; a child forked without exec holds it too, so
    the watcher then waits for that child as well."""

    def __init__(self, say: Say = _stderr) -> None:
        sweep_stale(say)
        self.lock = HarnessLock()
        self._write_end = _start_watcher(self.lock)

    def own(self, run_id: str | None, path: Path | str | None) -> None:
        self.lock.own(run_id, path)


def own(run_id: str | None = None, path: Path | str | None = None) -> None:
    """Register a run (its id, its directory or mountpoint) with this process's lifeline,
    starting the lifeline first if this process has none. Call it before anything of the
    run exists."""
    global _current
    if os.environ.get(OFF_ENV) == "1":
        return
    with _lock:
        if _current is None or _current[0] != os.getpid():
            _current = (os.getpid(), _start())
        if _current[1] is not None:
            _current[1].own(run_id, path)


def lock_env() -> dict[str, str]:
    """env.LOCK for what this process starts: the path of its lock file, empty if it has
    none (which also hides one inherited from an outer harness), as when the lifeline is
    off: a run `own` did not register is not that lock's to keep. Call `own` first."""
    if os.environ.get(OFF_ENV) == "1":
        return {env.LOCK: ""}
    current = _current[1] if _current is not None and _current[0] == os.getpid() else None
    return {env.LOCK: str(current.lock.path) if current is not None else ""}


def _start() -> Lifeline | None:
    """A lifeline, or None (said once) where none can be had: the runs still go on, and
    still clean up after themselves on every exit path the harness sees."""
    try:
        return Lifeline()
    except OSError as exc:
        _stderr(f"no lifeline for this harness ({exc}): if it is killed with SIGKILL, its"
                " runs' processes may outlive it until `torchchaos clean --yes`")
        return None


def sweep_stale(say: Say = _stderr) -> list[leftovers.Leftover]:
    """Remove what no live harness owns; say so in one line. Returns what was found.
    Costs a few milliseconds when there is nothing (one pass over /proc, `ip` twice)."""
    found = leftovers.stale(leftovers.inventory())
    if found:
        failures = leftovers.remove(found)
        shown = ", ".join(x.describe() for x in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        say(f"removed {len(found)} leftover(s) of dead harnesses: {shown}{more}")
        for failure in failures:
            say(f"could not remove {failure}")
    return found


def _start_watcher(lock: HarnessLock) -> int:
    """Start the watcher; return the pipe's write end (held until this process ends)."""
    read_end, write_end = os.pipe()  # both close-on-exec: no other child inherits them
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCHCHAOS_")}
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (*env.import_path(), environ.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "torchchaos.host.lifeline", str(lock.path), str(lock.fd)]
    setsid = shutil.which("setsid")  # util-linux, as nsenter
    try:
        started = subprocess.Popen([setsid, "--fork", *command] if setsid else command,
                                   stdin=read_end, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, pass_fds=(lock.fd,), env=environ,
                                   cwd="/", start_new_session=True)
        if setsid:  # it forks the watcher and exits at once: waited for, so no zombie
            started.wait(timeout=30)
    finally:
        os.close(read_end)
    return write_end


def watch(lock_path: Path, lock_fd: int | None = None) -> None:
    """The watcher: wait for the harness's end, then remove what is left of its runs."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    while os.read(0, 4096):  # nothing is ever written: this returns b"" at the end
        pass
    failures = remove_runs(LockFile.read(lock_path), lambda words: _note(lock_fd, words))
    if not failures:  # else the file stays: the next start or `clean` tries again
        lock_path.unlink(missing_ok=True)


def remove_runs(lock: LockFile, say: Say, pauses: tuple[float, ...] = PAUSES) -> list[str]:
    """Remove what is left of a dead harness's runs, round after round while any process
    of them survives (held in the kernel: a driver, a hung filesystem): while this runs the
    lock stays held, so no sweep competes. Returns what the last round could not remove
    (a mount, a namespace: left to the next sweep)."""
    failures = _round(lock)
    for attempt in itertools.count():
        if not failures:
            break
        pause = pauses[min(attempt, len(pauses) - 1)]
        time.sleep(pause)  # before looking again: what just died may not be reaped yet
        left = [x.name for x in leftovers.of_lock(leftovers.inventory(), lock)
                if x.kind == "process"]
        if left:
            say(f"{len(left)} process(es) of its runs survived SIGKILL ({', '.join(left[:5])});"
                f" still killing, round {attempt + 2}")
        failures = _round(lock)  # with no process left, what they kept busy goes now
        if not left:
            break  # what still fails (a mount, a namespace) is left to the next sweep
    for failure in failures:
        say(f"could not remove {failure}")
    return failures


def _round(lock: LockFile) -> list[str]:
    return leftovers.remove(leftovers.of_lock(leftovers.inventory(), lock), ROUND_SECONDS)


def _note(lock_fd: int | None, words: str) -> None:
    """Say it where it is looked for: in the lock file (through the inherited descriptor:
    the file may be unreadable by path), which `torchchaos clean` shows once dead."""
    if lock_fd is None:
        return
    try:
        note(lock_fd, {"note": words, "time": time.time()})
    except OSError:
        pass  # nowhere to say it; the removal goes on


if __name__ == "__main__":
    # argv[2]: the lock's descriptor, inherited and held open (keeps the lock held)
    watch(Path(sys.argv[1]), int(sys.argv[2]))
