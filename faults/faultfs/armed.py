"""Faults armed on the fault filesystem, waiting for the operations they hit.

A fault is armed (by a rank's agent at its trigger, or by a test) and then
hits the next matching operations on the mount: `count` of them for an errno
fault, one write for a torn write, every operation for `duration` seconds
for slow I/O. Kept apart from the filesystem so the matching rules read in
one place.
"""

from __future__ import annotations

import errno
import threading
import time
from dataclasses import dataclass, field

ERRNO_MODES = {"enospc": errno.ENOSPC, "eio": errno.EIO}
ARMED_MODES = (*ERRNO_MODES, "torn", "slow")
# the operation names the filesystem reports; `any` matches all of them
OPS = ("open", "create", "write", "truncate", "fsync", "fsyncdir", "rename", "unlink",
       "rmdir", "mkdir", "link", "read")


@dataclass
class Armed:
    mode: str  # one of ARMED_MODES
    op: str = "write"  # an entry of OPS, or "any"
    count: int = 1  # operations to hit (errno modes)
    keep: float = 0.5  # torn: fraction of the write that reaches the disk
    delay: float = 0.05  # slow: seconds added to each operation
    duration: float = 10.0  # slow: seconds the slowdown lasts
    fault_id: str = ""
    armed_at: float = field(default_factory=time.monotonic)

    def matches(self, op: str) -> bool:
        if self.mode == "slow":
            return op != "release" and time.monotonic() - self.armed_at < self.duration
        return self.op in (op, "any")

    def expired(self) -> bool:
        if self.mode == "slow":
            return time.monotonic() - self.armed_at >= self.duration
        return self.count <= 0


class ArmedFaults:
    """The armed faults of one mount; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: list[Armed] = []

    def arm(self, fault: Armed) -> None:
        with self._lock:
            self._armed.append(fault)

    def take(self, op: str) -> Armed | None:
        """The fault that hits this operation, if any (used up as it hits)."""
        with self._lock:
            self._armed = [a for a in self._armed if not a.expired()]
            for fault in self._armed:
                if fault.matches(op):
                    if fault.mode != "slow":
                        fault.count -= 1
                    return fault
        return None

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()
