"""The fault filesystem's process: mount, serve, and carry out crashes.

Run as `python -m torchchaos.faults.faultfs` by `torchchaos.faults.faultfs.mount.Mount`, never by
hand. It mounts itself over MOUNTPOINT (libfuse 3 through mfusepy,
`auto_unmount`: if this process dies, even by SIGKILL, fusermount3 unmounts)
and serves the folder that was there before, through a descriptor of it opened
before the mount (`--root-fd`, inherited from the harness). The harness's
files may lie inside the mountpoint (a mount over a whole run directory): its
`--private` folders pass through outside the fault model, and every path of
this process's own (state, shadow copies) is reached through the descriptor,
never through its own mount. It answers commands on a unix socket in its
state folder, one JSON object per line:

- `{"cmd": "arm", "mode": "enospc"|"eio"|"torn"|"slow", ...}`: hit the next
  matching operations (see `armed.Armed`);
- `{"cmd": "crash", "lose_unsynced": bool}`: kill every process of the run,
  then, for a power loss, drop what was not durable;
- `{"cmd": "bitrot", "file": GLOB, "seed": N, "bits": N, "crash": bool}`:
  flip bits in a committed file, or in any file where none is committed (then
  crash, so the job must read it back);
- `{"cmd": "lay", "blobs": PATH, "files": {PATH: [[offset, length, blob offset],
  ...]}}`: a recording mount only: serve those files' bytes from that blob file
  (a crash state's recovery, `torchchaos.explore.crashstates.lay`);
- `{"cmd": "settle"}`: answers once no crash is in progress;
- `{"cmd": "ping"}`.

The crash runs here, not in the rank that asked for it: the runner reaps a
dead job's processes, and a half-done rewind must not die with them.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fnmatch
import json
import os
import random
import signal
import socket
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any

from torchchaos.faults.faultfs import client
from torchchaos.faults.faultfs.armed import Armed, ArmedFaults
from torchchaos.faults.faultfs.durability import DurabilityTracker
from torchchaos.faults.faultfs.fs import FaultFS
from torchchaos.faults.faultfs.recording import Recorder
from torchchaos.faults.filebits import flip_file_bits, newest_big_file, seeded_bit_offsets
from torchchaos.host import procs
from torchchaos.rundir.history import HistoryWriter

KILL_TIMEOUT = 15.0
PR_SET_PDEATHSIG = 1


class Daemon:
    def __init__(self, root: Path, state: Path, log: HistoryWriter, run_id: str | None,
                 private: frozenset[str] = frozenset(), record: Path | None = None) -> None:
        self.root = root
        self.tracker = DurabilityTracker(root, state / "shadow", private)
        self.armed = ArmedFaults()
        self.log = log
        self.run_id = run_id
        recorder = Recorder(record) if record is not None else None
        self.fs = FaultFS(root, self.tracker, self.armed, log, self._crash_later, private,
                          recorder)
        self.busy = threading.Lock()  # held while a crash or bit rot is carried out

    # -- commands ------------------------------------------------------------
    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        cmd = request.pop("cmd", None)
        if cmd == "ping":
            return {"ok": True}
        if cmd == "settle":
            with self.busy:
                return {"ok": True}
        if cmd in ("arm", "crash", "bitrot") and self.fs.recorder is not None:
            # its kernel keeps file contents cached (FaultFS.init_with_config): a fault
            # that changes files behind the kernel's back would be read around
            return {"ok": False, "error": f"a recording mount takes no faults ({cmd})"}
        if cmd == "arm":
            known = {f.name for f in fields(Armed)}
            self.armed.arm(Armed(**{k: v for k, v in request.items() if k in known}))
            self.log.record("fs_armed", **request)
            return {"ok": True}
        if cmd == "crash":
            return self.crash(bool(request.get("lose_unsynced")), request.get("pids"),
                              str(request.get("fault_id", "")))
        if cmd == "bitrot":
            return self.bitrot(request)
        if cmd == "lay":
            return self.lay(request)
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    def crash(self, lose_unsynced: bool, pids: list[int] | None = None,
              fault_id: str = "") -> dict[str, Any]:
        """The machine goes down: every process of the run dies; with
        `lose_unsynced`, so does everything the disk had not made durable."""
        with self.busy:
            self.fs.down.set()
            try:
                # the processes die before the disk's refusals reach them (`FaultFS.killed`)
                killed = self._kill(pids)
                with self.fs.mutex:
                    dropped = self.tracker.power_loss().to_dict() if lose_unsynced else {}
                    self.armed.clear()  # a reboot forgets pending faults
            finally:
                self.fs.down.clear()  # up again, also if a process would not die
                self.fs.killed.clear()
        self.log.record("fs_crash", lose_unsynced=lose_unsynced, killed=killed,
                        fault=fault_id, **dropped)
        return {"ok": True, "killed": killed, **dropped}

    def lay(self, request: dict[str, Any]) -> dict[str, Any]:
        """Lay extents of a recording's blob file over files already there (sized, holes):
        a crash state's image served with no copy of it (`Recorder.lay`)."""
        if self.fs.recorder is None:
            return {"ok": False, "error": "only a recording mount lays out an image"}
        files = {os.stat(self.root / path).st_ino: [tuple(piece) for piece in pieces]
                 for path, pieces in request["files"].items()}
        self.fs.recorder.lay(Path(request["blobs"]), files)
        return {"ok": True, "files": len(files)}

    def _crash_later(self, fault: Armed) -> None:
        threading.Thread(target=self.crash, args=(False, None, fault.fault_id),
                         daemon=True).start()

    def _kill(self, pids: list[int] | None) -> list[int]:
        """SIGKILL the given pids (and their children), or every process of the run;
        the mount's refusals wait until the first round is sent (`FaultFS.killed`)."""
        if pids is None and not self.run_id:
            self.fs.killed.set()  # nothing to kill
            return []
        return procs.reap(self.run_id if pids is None else None, pids or [],
                          timeout=KILL_TIMEOUT, sent=self.fs.killed.set)

    def bitrot(self, request: dict[str, Any]) -> dict[str, Any]:
        pattern = str(request.get("file") or "*")
        rng = random.Random(int(request.get("seed", 0)))
        def matching(paths: list[Path]) -> list[Path]:
            return [p for p in paths if fnmatch.fnmatch(str(p.relative_to(self.root)), pattern)
                    and p.stat().st_size > 0]

        with self.busy, self.fs.mutex:
            # A job that never fsyncs has no committed file, yet the kernel writes its
            # files back within seconds: rot those then, rather than test nothing.
            files = (matching(self.tracker.committed_files())
                     or matching(self.tracker.files()))
            if not files:
                self.log.record("fs_bitrot", file=None, pattern=pattern)
                return {"ok": False,
                        "error": f"no committed file (nor any file) matches {pattern!r}"}
            victim = newest_big_file(files)
            flipped = seeded_bit_offsets(victim.stat().st_size, rng, int(request.get("bits", 1)))
            flip_file_bits(victim, flipped)
        rel = str(victim.relative_to(self.root))
        self.log.record("fs_bitrot", file=rel, bits=flipped, fault=request.get("fault_id", ""))
        if request.get("crash", True):
            self.crash(False, None, str(request.get("fault_id", "")))
        return {"ok": True, "file": rel, "bits": flipped}

    # -- serving -------------------------------------------------------------
    def serve_control(self, path: str) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        client.short_address(path, server.bind)
        server.listen(16)
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            line = stream.readline()
            try:
                reply = self.handle(json.loads(line))
            except Exception as exc:  # a bad command must not take the filesystem down
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            try:
                stream.write(json.dumps(reply).encode() + b"\n")
                stream.flush()
            except OSError:
                pass  # the asker was killed by the crash it asked for


def _exit_with_parent() -> None:
    """SIGTERM this process when the harness that started it dies (even by SIGKILL):
    libfuse then leaves its loop and unmounts, so no mount outlives its owner."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def beneath(path: Path, mountpoint: Path, root: Path) -> Path:
    """`path` as this process must reach it once mounted: through the root descriptor
    when it lies inside the mountpoint (else the mount would serve itself)."""
    try:
        return root / path.relative_to(mountpoint)
    except ValueError:
        return path


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m torchchaos.faults.faultfs")
    parser.add_argument("mountpoint", type=Path, help="an absolute path, symlinks resolved")
    parser.add_argument("--root-fd", type=int, default=None,
                        help="a descriptor of MOUNTPOINT opened before the mount"
                             " (default: open it here, before mounting)")
    parser.add_argument("--private", action="append", default=[], metavar="NAME",
                        help="a top-level folder outside the fault model (repeatable)")
    parser.add_argument("--state", type=Path, required=True, help="shadow/ lives here")
    parser.add_argument("--socket", required=True, help="unix socket (a path) for commands")
    parser.add_argument("--history", type=Path, required=True)
    parser.add_argument("--run-id", default=None, help="a crash kills this run's processes")
    parser.add_argument("--record", type=Path, default=None, metavar="BLOBS",
                        help="recording mode: keep every write's bytes in this file and"
                             " note every path the job looks at")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)

    import mfusepy  # loads libfuse3: only in this process

    _exit_with_parent()
    fd = args.root_fd
    if fd is None:
        fd = os.open(args.mountpoint, os.O_PATH | os.O_DIRECTORY)
    root = Path(f"/proc/self/fd/{fd}")
    # opened (history) and bound (socket) now, before the mount hides their folders
    log = HistoryWriter(args.history, source="faultfs", mount=str(args.mountpoint))
    record = beneath(args.record, args.mountpoint, root) if args.record else None
    daemon = Daemon(root, beneath(args.state, args.mountpoint, root), log, args.run_id,
                    frozenset(args.private), record)
    daemon.serve_control(args.socket)
    log.record("fs_mount", pid=os.getpid())

    class Fuse(mfusepy.FUSE):
        """mfusepy 3.1 drops the file handle that libfuse 3 passes to truncate: an
        ftruncate of a file unlinked while open (no path under hard_remove) could not
        name its file. This passes it on, as it does for read and write."""

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            fh = fip.contents.fh if fip else None
            name = None if path is None else path.decode(self.encoding, self.errors)
            return self.operations.truncate(name, length, fh)

    try:
        Fuse(daemon.fs, str(args.mountpoint), foreground=True, auto_unmount=True,
             fsname="torchchaos-faultfs", allow_other=True)
    except RuntimeError as exc:  # libfuse's non-zero status, e.g. after SIGTERM
        log.record("fs_unmount", status=str(exc))
        return
    log.record("fs_unmount")
