"""Which harness owns which runs: one locked file per live harness process.

A harness that starts a run first writes the run's id and directory into its
own file in the state folder (`state_dir()`), a file it holds an exclusive
`flock` on for as long as it lives. The kernel drops the lock when the last
descriptor of the file closes, however the process ended (SIGKILL and the OOM
killer included), so "is this harness alive?" is one non-blocking lock
attempt, immune to pid reuse. Whatever of a run exists while no live file
lists it is a leftover (`torchchaos.host.leftovers`).

Harnesses need not share a state folder (another `TORCHCHAOS_STATE_DIR`, each
user's `$XDG_RUNTIME_DIR`), so a harness also finds the others' files without
their folder: every process a harness starts names its file in its
environment (`torchchaos.env.LOCK`, `read_live`), and a live file is always held
open by its harness, so `/proc/*/fd` shows it (`held_anywhere`), even deleted.

Races this layout rules out:
- a file is locked before it gets its `.lock` name (made under a temporary
  name, locked, renamed), so no reader ever sees an unlocked file of a live
  harness;
- a run is written (one `write`, whole lines) before anything of it exists,
  so a reader that lists resources first and owners second never takes a
  live run's resource for a leftover.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

STATE_ENV = "TORCHCHAOS_STATE_DIR"  # where the lock files live (default: see state_dir)
SUFFIX = ".lock"
# a run's id as the runners make them (12 hex digits; a multi-node job's node adds
# "-node-N"), for things named after their run (cgroups, TMPDIR links)
RUN_ID = r"[0-9a-f]{8,}(?:-node-\d+)?"
LOCK_NAME = re.compile(r"\d+-[0-9a-f]{8}\.lock")  # HarnessLock's names: <pid>-<random>.lock
DELETED = " (deleted)"  # how /proc/PID/fd shows a file unlinked while open


def state_dir() -> Path:
    """The folder of harness lock files: $TORCHCHAOS_STATE_DIR, else /run/torchchaos for
    root (a tmpfs: emptied at boot, as locks should be), else $XDG_RUNTIME_DIR/torchchaos,
    else torchchaos-<uid> in the temporary folder."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    if os.geteuid() == 0 and Path("/run").is_dir():
        return Path("/run/torchchaos")
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "torchchaos"
    return Path(tempfile.gettempdir()) / f"torchchaos-{os.geteuid()}"


@dataclass
class LockFile:
    """What one harness's file says: who it is and the runs it owns."""

    path: Path
    pid: int = 0
    command: str = ""
    runs: set[str] = field(default_factory=set)  # run ids
    dirs: set[str] = field(default_factory=set)  # run directories and mountpoints
    notes: list[str] = field(default_factory=list)  # what its watcher could not remove

    @classmethod
    def read(cls, path: Path) -> LockFile:
        found = cls(path)
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return found
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line being written right now: its resource does not exist yet
            found.pid = entry.get("pid", found.pid)
            found.command = entry.get("command", found.command)
            if entry.get("run"):
                found.runs.add(entry["run"])
            if entry.get("dir"):
                found.dirs.add(entry["dir"])
            if entry.get("note"):
                found.notes.append(str(entry["note"]))
        return found

    def owns_path(self, path: str) -> bool:
        return any(path == d or path.startswith(d.rstrip("/") + "/") for d in self.dirs)


class HarnessLock:
    """This process's locked file; `own` adds runs to it. `fd` stays open (and locked)
    until the process ends; a child given the descriptor keeps the lock alive too."""

    def __init__(self, folder: Path | None = None) -> None:
        folder = folder or state_dir()
        folder.mkdir(parents=True, exist_ok=True)
        # absolute and without links: the watcher (cwd /) and every process of the runs
        # (env.LOCK) are given this path, and /proc/PID/fd shows it so
        folder = folder.resolve()
        name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        temporary = folder / f".{name}.new"
        self.fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        os.set_inheritable(self.fd, False)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self._write({"pid": os.getpid(), "started": time.time(),
                     "command": " ".join(_own_command())[:500]})
        self.path = folder / f"{name}{SUFFIX}"
        os.rename(temporary, self.path)
        self._owned: set[tuple[str, str]] = set()

    def own(self, run_id: str | None = None, path: Path | str | None = None) -> None:
        key = (run_id or "", str(path or ""))
        if key in self._owned:
            return
        entry: dict[str, str] = {}
        if run_id:
            entry["run"] = run_id
        if path:
            entry["dir"] = str(Path(path).resolve())
        self._write(entry)
        self._owned.add(key)

    def _write(self, entry: dict[str, object]) -> None:
        note(self.fd, entry)


def note(fd: int, entry: dict[str, object]) -> None:
    """Append one line to a lock file through a descriptor of it (one `write`: a reader
    never sees half of it but as a line it skips)."""
    os.write(fd, (json.dumps(entry) + "\n").encode())


def _own_command() -> list[str]:
    try:
        return Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def lock_files(folder: Path | None = None) -> list[Path]:
    folder = (folder or state_dir()).resolve()  # as HarnessLock names them
    try:
        return sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIX))
    except FileNotFoundError:
        return []


def is_live(path: Path) -> bool:
    """Some process holds this file's lock (its harness, or that harness's watcher). False
    only when that is proven: a file that cannot be opened for another reason counts as
    live. A missing file is not live here, but may be held open deleted: `held_anywhere`."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the lock if we got it
    return False


@dataclass
class Owners:
    """The runs and folders of every live harness, and the files of dead ones."""

    live: list[LockFile]
    dead: list[LockFile]

    def owns_run(self, run_id: str) -> bool:
        """`run_id` may be a prefix (network names keep the first 8 characters)."""
        return any(r.startswith(run_id) for f in self.live for r in f.runs)

    def owns_path(self, path: str) -> bool:
        return any(f.owns_path(path) for f in self.live)

    def holds(self, lock_path: str) -> bool:
        """This lock file (a process's env.LOCK) is one of the live ones."""
        return any(str(f.path) == lock_path for f in self.live)

    def plus(self, live: list[LockFile]) -> Owners:
        known = {f.path for f in self.live}
        return Owners(self.live + [f for f in live if f.path not in known], self.dead)


def is_lock_path(value: str) -> bool:
    """A value of env.LOCK that names a harness's lock file; anything else (a relative
    path, another file) is ignored, and the process judged as one without the variable."""
    return os.path.isabs(value) and bool(LOCK_NAME.fullmatch(os.path.basename(value)))


def read_live(paths: set[str]) -> list[LockFile]:
    """The live ones of these lock files, read."""
    return [LockFile.read(Path(p)) for p in sorted(paths) if is_live(Path(p))]


def held_anywhere() -> list[LockFile]:
    """Every live lock file that some process we can see holds open, wherever its folder,
    deleted or not: the holder of a live lock always has it open (the harness never closes
    it; its watcher inherited it). Read and tried through the holder's descriptor, which
    reaches a deleted file too. A pass over every descriptor of every process (~10 ms per
    thousand): asked only when something looks unowned otherwise."""
    found: dict[str, LockFile] = {}
    for fd in _descriptors():
        try:
            path = os.readlink(fd).removesuffix(DELETED)
        except OSError:
            continue  # gone meanwhile, or a process we may not look into
        if path not in found and LOCK_NAME.fullmatch(os.path.basename(path)) and is_live(fd):
            lock = LockFile.read(fd)
            lock.path = Path(path)
            found[path] = lock
    return list(found.values())


def _descriptors() -> list[Path]:
    """/proc/PID/fd/N of every process we may look into (a glob would raise on 3.10-3.12
    for a process that ends while it lists its descriptors)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            found += [Path("/proc", pid, "fd", n) for n in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue  # ended meanwhile, or not ours to look into
    return found


def owners(folder: Path | None = None) -> Owners:
    live, dead = [], []
    for path in lock_files(folder):
        (live if is_live(path) else dead).append(LockFile.read(path))
    return Owners(live, dead)
