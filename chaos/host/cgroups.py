"""Memory cgroups for the OOM fault: one folder per run, one per limited rank.

(A frozen node's freezer cgroups are named the same way, `torchchaos.host.freezer`;
`leftovers` lists both.)

The kernel's OOM killer acts on a memory cgroup whose limit is reached: a
rank moved into a cgroup of its own with a limit is killed by the kernel,
as a rank of a real job is, and no other process of the machine feels it.
A run's cgroups live in one folder, `torchchaos-<run id>`, at the root of
the memory hierarchy (cgroup v1: `/sys/fs/cgroup/memory`; v2: the unified
`/sys/fs/cgroup` where the memory controller is on); `leftovers` lists those
of runs whose harness died. Only root (or a delegated hierarchy) can write
them; where none is writable, `memory_root()` is None and the fault uses a
limit the rank hits by itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from torchchaos.host.owners import RUN_ID

MOUNT = Path("/sys/fs/cgroup")
PREFIX = "torchchaos-"
OURS = re.compile(rf"^{PREFIX}({RUN_ID})$")


def memory_root() -> Path | None:
    """The writable root of the memory hierarchy, or None."""
    v1 = MOUNT / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        return v1 if os.access(v1, os.W_OK) else None
    controllers = MOUNT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return MOUNT if os.access(MOUNT, os.W_OK) else None
    return None


def is_v2(root: Path) -> bool:
    return (root / "cgroup.controllers").exists()


def run_group(root: Path, run_id: str) -> Path:
    return root / f"{PREFIX}{run_id}"


def create_run_group(root: Path, run_id: str) -> Path:
    """The run's folder, with the memory controller on for its children (v2)."""
    group = run_group(root, run_id)
    group.mkdir(exist_ok=True)
    if is_v2(root):
        (group / "cgroup.subtree_control").write_text("+memory")
    return group


def confine(group: Path, name: str, limit_bytes: int, pid: int) -> Path:
    """Make `group/name` with a memory limit (swap included) and move `pid` into it."""
    child = group / name
    child.mkdir(exist_ok=True)
    if is_v2(group):
        (child / "memory.max").write_text(str(limit_bytes))
        _write_if_there(child / "memory.swap.max", "0")
    else:
        (child / "memory.limit_in_bytes").write_text(str(limit_bytes))
        _write_if_there(child / "memory.memsw.limit_in_bytes", str(limit_bytes))
        _write_if_there(child / "memory.swappiness", "0")
    (child / "cgroup.procs").write_text(str(pid))
    return child


def remove(group: Path, wait: float = 0.0) -> bool:
    """Remove a run's folder and its children; True once it is gone (or was never there).
    A cgroup with a process in it cannot be removed (EBUSY): a killed rank counts until
    its parent has reaped it, so this tries again for up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            if group.is_dir():
                for child in sorted(p for p in group.iterdir() if p.is_dir()):
                    _rmdir(child)
                _rmdir(group)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def leftovers() -> list[tuple[str, str]]:
    """(folder, run id) of every run folder there is now: the memory hierarchy's (an OOM
    fault's) and the freezer's (a frozen node's, `torchchaos.faults.freeze`)."""
    from torchchaos.host import freezer

    found: set[tuple[str, str]] = set()
    for root in {r for r in (memory_root(), freezer.root()) if r is not None}:
        for entry in sorted(root.iterdir()):
            match = OURS.match(entry.name)
            if match and entry.is_dir():
                found.add((str(entry), match.group(1)))
    return sorted(found)


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass


def _write_if_there(path: Path, value: str) -> None:
    if path.exists():
        try:
            path.write_text(value)
        except OSError:  # e.g. swap accounting off: the limit alone still holds
            pass


def kernel_log() -> list[str]:
    """The kernel's ring buffer as `dmesg` prints it ([] where it cannot be read)."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.splitlines() if done.returncode == 0 else []


def oom_reports(lines: list[str], group: Path) -> list[str]:
    """The kernel's OOM-killer reports (from "invoked oom-killer" to "Killed process")
    that name a cgroup under `group`, as the kernel wrote them."""
    kept: list[str] = []
    block: list[str] = []
    for line in lines:
        if "invoked oom-killer" in line:
            block = [line]
        elif block:
            block.append(line)
            if "Killed process" in line:
                if any(f"/{group.name}/" in b for b in block):
                    kept += block
                block = []
    return kept
