"""The fault filesystem's operations: a pass-through to the folder it covers.

Every call maps a mount path to the same path under `root`: the mountpoint
folder itself as it was before the mount, reached through a descriptor the
daemon opened first (`/proc/self/fd/N`: a path through it never crosses into
the mount above). Nothing moves anywhere, so every file is back at its own
path the moment the mount goes, however it goes.

Each call tells the durability tracker what is about to change, applies the
fault armed for that operation (if any) and records the mutation in the run's
history. While the mount is `down` (a simulated crash is being carried out)
every operation but `release` fails with EIO, once the crash has sent its
SIGKILLs (`killed`, at most a few seconds): a process stuck in a FUSE request
that never returns cannot even be SIGKILLed, so nothing here may block on the
crash for long; and a process that met the EIO before its SIGKILL could print
it, where a power loss leaves no word (a rank's "OSError: [Errno 5]" in a
rename read as an exception mid-save, 2026-11-28).

`private` names top-level folders that are outside the fault model (the
harness's own `_chaos/` when the mount covers a whole run directory): plain
pass-through there, never down, never faulted, tracked or recorded, and a
rename or hard link across their border fails with EXDEV as between two
filesystems.

Real fsync is skipped on the folder below: durability is what the tracker
models, and the real disk's own durability is not under test.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import mfusepy

from torchchaos.faults.faultfs.armed import ERRNO_MODES, Armed, ArmedFaults
from torchchaos.faults.faultfs.durability import DurabilityTracker
from torchchaos.faults.faultfs.recording import Recorder
from torchchaos.rundir.history import HistoryWriter

Crash = Callable[[Armed], None]  # start a crash of the job (runs in another thread)
# How long a refusal waits for the crash's SIGKILLs (finding the run's processes takes
# milliseconds; a crash with none to kill sets it at once)
REFUSE_AFTER_KILL_SECONDS = 2.0

STAT_KEYS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks",
             "st_atime_ns", "st_mtime_ns", "st_ctime_ns")


def _attrs(st: os.stat_result) -> dict[str, Any]:
    found = {key: getattr(st, key) for key in STAT_KEYS}
    for short in ("atime", "mtime", "ctime"):
        found[f"st_{short}"] = found.pop(f"st_{short}_ns")
    return found


class Untracked:
    """The tracker's interface for private folders: no model, removals are plain."""

    def created(self, path: Path) -> None:
        pass

    def before_data_change(self, file: Path | int) -> None:
        pass

    def file_synced(self, file: Path | int) -> None:
        pass

    def dir_synced(self, path: Path) -> None:
        pass

    def before_replace(self, path: Path) -> None:
        pass

    def remove(self, path: Path) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)


UNTRACKED = Untracked()


def _tgid(tid: int) -> int:
    """The process a thread belongs to (FUSE names the calling thread)."""
    try:
        with open(f"/proc/{tid}/status") as status:
            for line in status:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return tid


class FaultFS(mfusepy.Operations):
    use_ns = True  # times in nanoseconds (mfusepy's modern interface)

    def __init__(self, root: Path, tracker: DurabilityTracker, armed: ArmedFaults,
                 log: HistoryWriter, crash: Crash, private: frozenset[str] = frozenset(),
                 recorder: Recorder | None = None) -> None:
        self.root = root
        self.recorder = recorder  # set: every write's bytes and every lookup are kept
        self.tracker = tracker
        self.armed = armed
        self.log = log
        self.crash = crash
        self.private = private
        self.mutex = threading.RLock()  # one mutation (and tracker update) at a time
        self.down = threading.Event()
        self.killed = threading.Event()  # the crash has sent its SIGKILLs
        # The name each open file was opened by: libfuse passes no path to operations on
        # a file unlinked while open (hard_remove), which a job may still read, write and
        # fsync, as on any disk (a rotation that deletes a checkpoint another rank has
        # open, an mmap of a deleted file, a TemporaryFile in the checkpoint folder).
        self.opened_as: dict[int, str] = {}

    def init_with_config(self, _conn: Any, config: Any) -> None:
        # no kernel caching of names or attributes: after a simulated power loss the
        # tree changes under the kernel's feet; unlink removes at once (no .fuse_hidden)
        for key in ("entry_timeout", "negative_timeout", "attr_timeout"):
            setattr(config, key, 0.0)
        config.hard_remove = 1
        config.use_ino = 1
        config.kernel_cache = 0
        if self.recorder is not None:
            # A recording mount (the recording run, a crash state's recovery) takes no
            # faults (Daemon refuses them), and every change to its files passes through
            # here: the kernel may keep their contents across opens, so a recovery that
            # hashes a GB checkpoint and then loads it reads it from the daemon once.
            # Not `kernel_cache`: this path-based filesystem gives each name of a file its
            # own kernel inode, and a write through a hard link must show through the
            # other names: `auto_cache` drops the cache at an open that sees the size or
            # mtime changed. Fault mounts cache nothing: a power loss changes files
            # under the kernel.
            config.auto_cache = 1

    # -- helpers -------------------------------------------------------------
    def _named(self, path: str | None, fh: int | None) -> tuple[str, dict[str, bool]]:
        """The path of an operation on an open file, and the fields that log it: a file
        unlinked while open goes by the name it was opened with, logged `unlinked` (no
        folder holds it any more: the crash-state replay leaves it out)."""
        if path is not None:
            return path, {}
        return self.opened_as.get(fh, "") if fh is not None else "", {"unlinked": True}

    def _real(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    @staticmethod
    def _is_root(path: str) -> bool:
        """The root is a /proc magic link: calls that would act on a link itself (lstat,
        lchown) must follow it there."""
        return path.strip("/") == ""

    def _private(self, path: str) -> bool:
        return path.lstrip("/").split("/", 1)[0] in self.private

    def _recording(self, path: str) -> bool:
        """Does this mount keep `path`'s written bytes in its blob file (`recording`)?"""
        return self.recorder is not None and not self._private(path)

    def _same_side(self, old: str, new: str) -> None:
        if self._private(old) != self._private(new):
            raise mfusepy.FuseOSError(errno.EXDEV)

    @contextlib.contextmanager
    def _changing(self, path: str) -> Iterator[DurabilityTracker | Untracked]:
        """The tracker to tell about a change to `path`, held for the change; private
        paths get no model and no lock (a crash's rewind must not stall the harness).
        A recording mount takes no power loss (Daemon refuses it), so it models nothing:
        a recovery that overwrites a GB file in place would otherwise copy it first."""
        if self._private(path):
            yield UNTRACKED
            return
        with self.mutex:
            yield UNTRACKED if self.recorder is not None else self.tracker

    def _refuse(self) -> NoReturn:
        """EIO, once the crash under way has sent its SIGKILLs: the process that asked
        then dies before it can act on it (bounded: see the module's docstring)."""
        self.killed.wait(REFUSE_AFTER_KILL_SECONDS)
        raise mfusepy.FuseOSError(errno.EIO)

    def _gate(self, op: str, path: str) -> Armed | None:
        """Fail fast while down; return the armed fault that hits `op`, after
        sleeping if it is a slowdown; raise if it is an errno fault. Private paths
        pass untouched."""
        if self._private(path):
            return None
        if self.down.is_set():
            self._refuse()
        fault = self.armed.take(op)
        if fault is None:
            return None
        if fault.mode == "slow":
            time.sleep(fault.delay)
            return None
        if fault.mode in ERRNO_MODES:
            self._record(op, path, injected=fault.mode, fault=fault.fault_id)
            raise mfusepy.FuseOSError(ERRNO_MODES[fault.mode])
        return fault

    def _record(self, op: str, path: str | None, **fields: Any) -> None:
        if path and self._private(path):
            return
        pid = mfusepy.fuse_get_context()[2]
        if self.recorder is not None:
            fields["tgid"] = _tgid(pid)
        self.log.record("fs", op=op, path=(path or "").lstrip("/"), pid=pid, **fields)

    def _looked_at(self, op: str, path: str) -> None:
        """Recording: the job looked at `path` (stat, list, read)."""
        if self.recorder is not None and not self._private(path):
            self.recorder.looked_at(op, path.lstrip("/"), self.log,
                                    mfusepy.fuse_get_context()[2])

    # -- metadata ------------------------------------------------------------
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        if path is None:  # an open file unlinked (hard_remove): only its descriptor is left,
            # and the kernel passes it for an lseek, not for an fstat (known-limits.md)
            if fh is None:
                raise mfusepy.FuseOSError(errno.ESTALE)
            return _attrs(os.fstat(fh))
        if self.down.is_set() and not self._private(path):
            self._refuse()
        self._looked_at("stat", path)
        real = self._real(path)
        attrs = _attrs(os.fstat(fh) if fh is not None else os.stat(real) if self._is_root(path)
                       else os.lstat(real))
        if self._recording(path):  # a hole in the backing file is bytes in the blob file:
            # a tool that skips what looks sparse (st_blocks) must still read them
            attrs["st_blocks"] = max(attrs["st_blocks"], -(-attrs["st_size"] // 512))
        return attrs

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        self._gate("readdir", path)
        self._looked_at("list", path)
        # with use_ino the inode must be given: an entry with inode 0 is hidden by readdir(3)
        real = self._real(path)
        found = [(".", os.stat(real)), ("..", os.stat(real / ".."))]
        found += [(e.name, e.stat(follow_symlinks=False)) for e in os.scandir(real)]
        return [(name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0) for name, st in found]

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._real(path))
        return {key: getattr(st, key) for key in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
            "f_flag", "f_frsize", "f_namemax")}

    def chmod(self, path: str, mode: int) -> int:
        self._gate("chmod", path)
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._gate("chown", path)
        os.chown(self._real(path), uid, gid, follow_symlinks=self._is_root(path))
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._gate("utimens", path)
        os.utime(self._real(path), ns=times, follow_symlinks=self._is_root(path))
        return 0

    # -- files ---------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        self._gate("open", path)
        real = self._real(path)
        writing = flags & (os.O_WRONLY | os.O_RDWR)
        if not writing or flags & os.O_RDWR:
            self._looked_at("read", path)
        # The recording's extents change under the same lock as the file: a truncate
        # noted after another rank's write to the same file would drop that write.
        with self._changing(path) as tracker:
            if flags & os.O_TRUNC:
                tracker.before_data_change(real)
            fd = os.open(real, flags)
            self.opened_as[fd] = path
            if flags & os.O_TRUNC and self._recording(path):
                self.recorder.truncated(os.fstat(fd).st_ino, 0)
        if writing:
            self._record("open", path, trunc=bool(flags & os.O_TRUNC),
                         excl=bool(flags & os.O_EXCL))
        return fd

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        self._gate("create", path)
        real = self._real(path)
        with self._changing(path) as tracker:
            existed = os.path.lexists(real)
            if existed and flags & os.O_TRUNC:
                tracker.before_data_change(real)
            fd = os.open(real, flags | os.O_CREAT, mode)
            self.opened_as[fd] = path
            if not existed:
                tracker.created(real)
            if self._recording(path):  # under the lock, as in open()
                if not existed:
                    self.recorder.created(os.fstat(fd).st_ino)
                elif flags & os.O_TRUNC:
                    self.recorder.truncated(os.fstat(fd).st_ino, 0)
        self._record("create", path, trunc=bool(existed and flags & os.O_TRUNC),
                     excl=bool(flags & os.O_EXCL))
        return fd

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        path, _ = self._named(path, fh)
        self._gate("read", path)
        if self._recording(path):
            return self.recorder.read(fh, size, offset)
        return os.pread(fh, size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        path, unlinked = self._named(path, fh)
        fault = self._gate("write", path)
        with self._changing(path) as tracker:
            tracker.before_data_change(fh)
            if fault is not None and fault.mode == "torn":
                kept = os.pwrite(fh, data[: int(len(data) * fault.keep)], offset)
                self._record("write", path, offset=offset, size=len(data), torn=kept,
                             fault=fault.fault_id, **unlinked)
                self.down.set()  # nothing else reaches the disk: the machine is going down
                self.crash(fault)
                self._refuse()
            if self._recording(path):  # the bytes go to the blob file only
                blob = self.recorder.write(fh, data, offset)
                written = len(data)
            else:
                blob, written = None, os.pwrite(fh, data, offset)
        self._record("write", path, offset=offset, size=written,
                     **({"blob": blob} if blob is not None else {}), **unlinked)
        return written

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        path, unlinked = self._named(path, fh)
        self._gate("truncate", path)
        with self._changing(path) as tracker:
            target: int | Path = fh if fh is not None else self._real(path)
            tracker.before_data_change(target)
            os.truncate(target, length)
            if self._recording(path):
                self.recorder.truncated(os.stat(target).st_ino, length)
        self._record("truncate", path, length=length, **unlinked)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        path, unlinked = self._named(path, fh)
        self._gate("fsync", path)
        with self._changing(path) as tracker:
            tracker.file_synced(fh)
        self._record("fsync", path, **unlinked)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._gate("fsyncdir", path)
        with self._changing(path) as tracker:
            tracker.dir_synced(self._real(path))
        self._record("fsyncdir", path)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def release(self, path: str | None, fh: int) -> int:
        self.opened_as.pop(fh, None)
        os.close(fh)  # also while down: the descriptors of killed processes must close
        return 0

    # -- names ---------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> int:
        self._gate("mkdir", path)
        with self._changing(path) as tracker:
            os.mkdir(self._real(path), mode)
            tracker.created(self._real(path))
        self._record("mkdir", path)
        return 0

    def unlink(self, path: str) -> int:
        return self._remove("unlink", path)

    def rmdir(self, path: str) -> int:
        return self._remove("rmdir", path)

    def _remove(self, op: str, path: str) -> int:
        """The tracker removes (or keeps, if a durable listing still names it)."""
        self._gate(op, path)
        with self._changing(path) as tracker:
            tracker.remove(self._real(path))
        self._record(op, path)
        return 0

    def rename(self, old: str, new: str) -> int:
        self._same_side(old, new)
        self._gate("rename", old)
        with self._changing(new) as tracker:
            tracker.before_replace(self._real(new))
            os.rename(self._real(old), self._real(new))
        self._record("rename", old, to=new.lstrip("/"))
        return 0

    def link(self, target: str, source: str) -> int:
        self._same_side(target, source)
        self._gate("link", target)
        with self._changing(target):
            os.link(self._real(source), self._real(target))
        self._record("link", target, source=source.lstrip("/"))
        return 0

    def symlink(self, target: str, source: str) -> int:
        self._gate("symlink", target)
        with self._changing(target) as tracker:
            os.symlink(source, self._real(target))
            tracker.created(self._real(target))
        self._record("symlink", target, source=source)
        return 0
