"""Harness side of the fault filesystem: mount it, command it, always unmount.

`Mount` starts the daemon (`python -m torchchaos.faults.faultfs`) over a mountpoint,
waits until the kernel shows the mount, sends it commands, and on `close()`
(also from `__exit__`, so on exceptions and Ctrl-C) unmounts — lazily if a
process still holds a file open — and stops the daemon. The daemon mounts
with `auto_unmount`, so even a harness killed with SIGKILL leaves no mount.

The daemon serves the mountpoint's own folder through a descriptor opened
before the mount, so files never move: whatever ends the mount, they are at
their paths. The state folder may lie inside the mountpoint (a mount over a
whole run directory keeps its state in the run's `_chaos/`) if it is under one
of the `private` folders, which stay outside the fault model. Its control
socket is then reached through the daemon's descriptor (`/proc/PID/fd/N/...`):
a unix socket cannot be connected to through a FUSE path.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from torchchaos.env import HELPER
from torchchaos.errors import ChaosError
from torchchaos.faults.faultfs import client
from torchchaos.host import lifeline
from torchchaos.host.mounts import mounts_under

START_TIMEOUT = 20.0
READ_AHEAD_KB = 1024  # a recording mount's readahead (_widen_readahead)
FUSERMOUNT = "fusermount3"


class FaultFSError(ChaosError):
    """The fault filesystem could not be mounted or commanded."""


def unavailable_reason() -> str:
    """Why a FUSE mount cannot work here, or "" if it can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which(FUSERMOUNT) is None:
        return "fusermount3 not found (install Debian's fuse3)"
    try:
        import mfusepy  # noqa: F401  (loads libfuse3)
    except (ImportError, OSError) as exc:
        return f"libfuse3 or mfusepy missing: {exc}"
    return ""


class Mount:
    """One fault filesystem over `mountpoint`; its state lives in `state`; the top-level
    folders named in `private` pass through outside the fault model."""

    def __init__(self, mountpoint: Path, state: Path, history: Path,
                 run_id: str | None = None, private: tuple[str, ...] = (),
                 record: Path | None = None) -> None:
        self.mountpoint = mountpoint.resolve()
        self.state = state.resolve()
        self.history = history.resolve()
        self.run_id = run_id
        self.owner = run_id or uuid.uuid4().hex[:12]  # the daemon's mark (env.HELPER)
        self.private = private
        self.record = record.resolve() if record is not None else None  # blob file
        self.socket_path = str(self.state / "control.sock")
        self.daemon: subprocess.Popen[bytes] | None = None
        self.root_fd: int | None = None

    def _inside(self, path: Path) -> Path | None:
        """`path` relative to the mountpoint, or None if it lies outside."""
        try:
            return path.relative_to(self.mountpoint)
        except ValueError:
            return None

    def _check_own_files(self) -> None:
        """The daemon's own files may lie in the mount only where nothing is modelled."""
        for path in (self.state, self.history, *([self.record] if self.record else [])):
            rel = self._inside(path)
            if rel is not None and (not rel.parts or rel.parts[0] not in self.private):
                raise FaultFSError(f"the fault filesystem's file {path} lies inside its"
                                   f" mountpoint {self.mountpoint}, outside its private"
                                   " folders")

    def start(self) -> Mount:
        reason = unavailable_reason()
        if reason:
            raise FaultFSError(f"cannot mount the fault filesystem: {reason}")
        self._check_own_files()
        # a dead harness's mount and daemon are then found and removed (torchchaos.host.lifeline)
        lifeline.own(self.owner, self.mountpoint)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        # the daemon serves this folder through this descriptor once the mount hides it
        root_fd = os.open(self.mountpoint, os.O_PATH | os.O_DIRECTORY)
        self.root_fd = root_fd  # the number the daemon holds it at (see backing())
        try:
            self._spawn(root_fd)
        finally:
            os.close(root_fd)  # the daemon holds its own copy, at the same number
        self._wait_mounted()
        if self.record is not None:
            self._widen_readahead()
        return self

    def _spawn(self, root_fd: int) -> None:
        cmd = [sys.executable, "-m", "torchchaos.faults.faultfs", str(self.mountpoint),
               "--root-fd", str(root_fd), "--state", str(self.state),
               "--socket", str(self.state / "control.sock"), "--history", str(self.history)]
        cmd += [arg for name in self.private for arg in ("--private", name)]
        if self.run_id:
            cmd += ["--run-id", self.run_id]
        if self.record is not None:
            cmd += ["--record", str(self.record)]
        with open(self.state / "daemon.log", "ab") as log:
            self.daemon = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True,
                                           pass_fds=(root_fd,),
                                           env={**os.environ, HELPER: self.owner,
                                                **lifeline.lock_env()})
        rel = self._inside(self.state)
        if rel is not None:  # under the mount: only the daemon's descriptor reaches it
            self.socket_path = str(self.backing() / rel / "control.sock")

    def _wait_mounted(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        assert self.daemon is not None
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                tail = (self.state / "daemon.log").read_text(errors="replace").strip()
                self.close()
                raise FaultFSError("the fault filesystem exited at start: "
                                   + (tail.splitlines() or ["(no output)"])[-1])
            if self.mounted() and self._ping():
                return
            time.sleep(0.05)
        self.close()
        raise FaultFSError(f"the fault filesystem did not mount within {START_TIMEOUT:g} s")

    def backing(self) -> Path:
        """The folder under the mount as the daemon holds it, which the mount hides from
        everyone else: files written there are what the mount serves, unrecorded (a
        job held at its gate gets the folder it starts from this way)."""
        assert self.daemon is not None and self.root_fd is not None, "not started"
        return Path(f"/proc/{self.daemon.pid}/fd/{self.root_fd}")

    def _widen_readahead(self) -> None:
        """Sequential reads of a recording mount in requests of up to 1 MiB, not the
        kernel's default 128 KiB: a recovery that loads GBs of checkpoint through the
        daemon takes about 40% less time per GB (measured, issue 29). Each FUSE mount
        has a backing device of its own, gone with the unmount; where it cannot be set
        (no /sys, not root) reads just stay smaller."""
        dev = os.stat(self.mountpoint).st_dev
        knob = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        try:
            knob.write_text(str(READ_AHEAD_KB))
        except OSError:
            pass

    def _ping(self) -> bool:
        try:
            return bool(self.request({"cmd": "ping"}, timeout=1.0).get("ok"))
        except OSError:
            return False

    # -- commands ------------------------------------------------------------
    def request(self, command: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        return client.request(self.socket_path, command, timeout)

    def settle(self) -> None:
        """Wait until no crash is being carried out (before a relaunch)."""
        if self.daemon is not None and self.daemon.poll() is None:
            self.request({"cmd": "settle"})

    # -- teardown ------------------------------------------------------------
    def mounted(self) -> bool:
        """The kernel shows a mount at the mountpoint itself (not merely below it)."""
        return str(self.mountpoint) in mounts_under(self.mountpoint)

    def close(self) -> None:
        """Unmount and stop the daemon; safe to call twice, and after a failed start."""
        if self.mounted():
            done = subprocess.run([FUSERMOUNT, "-u", str(self.mountpoint)],
                                  capture_output=True).returncode == 0
            if not done:  # busy: detach now; files still open there fail from now on
                subprocess.run([FUSERMOUNT, "-u", "-z", str(self.mountpoint)],
                               capture_output=True)
                if self.daemon is not None:  # it would serve the open files until closed
                    self.daemon.terminate()
        if self.daemon is not None:
            try:
                self.daemon.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.daemon.pid, signal.SIGKILL)
                self.daemon.wait()
            self.daemon = None

    def __enter__(self) -> Mount:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
