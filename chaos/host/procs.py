"""Find and reap every process of a run.

torchrun starts each worker in its own session, so killing torchrun or its
process group leaves the workers alive. Every process of a run therefore
carries a marker in its environment (`TORCHCHAOS_RUN_ID=<id>`), inherited by
anything it forks or spawns, and reaping kills by marker as well as by the
live process tree. A process that escaped the tree (double-forked, reparented
to init) still carries the marker.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from torchchaos import env


def marked_pids(run_id: str) -> list[int]:
    """Pids of live processes whose initial environment carries this run's marker."""
    return [pid for pid, run in env_values((env.RUN_ID,)).items() if run == run_id]


def env_values(names: tuple[str, ...]) -> dict[int, str]:
    """Live (not zombie) processes of this user, other than this one, that have one of
    these variables, non-empty, in their initial environment: pid -> its value (the first
    of `names` it has)."""
    return {pid: next(values[n] for n in names if n in values)
            for pid, values in env_vars(names).items()}


def env_vars(names: tuple[str, ...]) -> dict[int, dict[str, str]]:
    """Live (not zombie) processes of this user, other than this one, that have any of
    these variables, non-empty, in their initial environment: pid -> those variables.

    "This user" is the real uid: processes of other users are never ours to reap, also
    when we are root and can read (and kill) them."""
    wanted = {name.encode() for name in names}
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            values = {}
            for item in (entry / "environ").read_bytes().split(b"\0"):
                name, _, value = item.partition(b"=")
                if name in wanted and value:
                    values[name.decode()] = value.decode(errors="replace")
            if values and real_uid(entry) == os.getuid() and not _is_zombie(entry):
                found[int(entry.name)] = values
        except OSError:
            continue
    return found


def holding(*paths: Path) -> list[int]:
    """Live processes of this user that hold one of `paths` open (a descriptor names it)."""
    wanted = {str(p) for p in paths}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if real_uid(entry) != os.getuid() or _is_zombie(entry):
                continue
            if any(os.readlink(fd) in wanted for fd in (entry / "fd").iterdir()):
                found.append(int(entry.name))
        except OSError:
            continue
    return sorted(found)


def real_uid(proc_dir: Path) -> int:
    """The process's real uid (status: "Uid: real effective saved fs"); a setuid program
    keeps its caller's."""
    for line in (proc_dir / "status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise OSError(f"no Uid line in {proc_dir}/status")


def _is_zombie(proc_dir: Path) -> bool:
    stat = (proc_dir / "stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def tree(pids: list[int]) -> list[int]:
    """The pids and all their live descendants."""
    found: list[int] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            family = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
        found.extend(p.pid for p in family if _alive(p))
    return found


def pid_alive(pid: int) -> bool:
    """A live process with this pid (a zombie has exited: it is not alive)."""
    try:
        return _alive(psutil.Process(pid))
    except psutil.Error:
        return False


def pid_stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP) or a tracer: it runs no code until continued."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap(run_id: str | None, roots: list[int], timeout: float = 10.0,
         sent: Callable[[], None] | None = None) -> list[int]:
    """SIGKILL every process of the run (found by marker, unless `run_id` is None)
    and every process in the trees of `roots`; return the pids that had to be killed.
    `sent` is called once the first round of SIGKILLs is out (see kill_until_gone)."""

    def victims() -> list[int]:
        marked = marked_pids(run_id) if run_id is not None else []
        return sorted(set(tree(roots)) | set(marked))

    killed, survivors = kill_until_gone(victims, timeout, sent)
    if survivors:
        raise RuntimeError(f"processes of run {run_id} survived SIGKILL: {survivors}")
    return killed


def kill_until_gone(victims: Callable[[], list[int]], timeout: float,
                    sent: Callable[[], None] | None = None) -> tuple[list[int], list[int]]:
    """SIGKILL whatever `victims()` finds, again and again (a dying agent may fork a
    worker meanwhile), until it finds nothing or `timeout` seconds passed: the pids that
    had to be killed, and those still there at the end. `sent()`, if given, is called
    once after the first round, when every process found then has its SIGKILL (or none
    was found): what the caller holds back until then no process of that round can
    act on (the fault filesystem's refusals during a crash).

    Stopped processes are sent SIGCONT too: a SIGKILLed process that is stopped dies
    anyway, but its parent may be waiting on it."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        found = victims()
        if found:
            killed.update(found)
            signal_all(found, signal.SIGKILL)
            signal_all(found, signal.SIGCONT)
        if sent is not None:
            sent()
            sent = None
        if not found:
            return sorted(killed), []
        if time.monotonic() > deadline:
            return sorted(killed), found
        time.sleep(0.05)
