"""The kernel's cgroup freezer: stop every process of a group at once, and let them go.

A frozen node is a machine that stops running without dying: a hypervisor that paused
the VM, a kernel stuck on a device, a node swapping itself to a standstill. Its
processes keep their sockets and their state, answer nothing, and go on where they
were once it comes back. SIGSTOP is a weaker copy: the parent sees the stop (waitpid),
and a process may be continued by anyone; a frozen cgroup is invisible from inside.

cgroup v1 (this project's CI machines): a folder under `/sys/fs/cgroup/freezer` whose
`freezer.state` is written FROZEN or THAWED and reads FREEZING until every task is
stopped. cgroup v2: `cgroup.freeze` written 1 or 0, `cgroup.events` saying `frozen 1`.
Docker's `pause` is this same freezer on a container's group.

A process SIGKILLed while frozen dies only once thawed: whoever removes a run's
leftovers thaws first (`thaw`).
"""

from __future__ import annotations

import time
from pathlib import Path

MOUNT = Path("/sys/fs/cgroup")


def root() -> Path | None:
    """The freezer hierarchy's root, or None where there is none to write."""
    v1 = MOUNT / "freezer"
    if (v1 / "cgroup.procs").exists():
        return v1
    if (MOUNT / "cgroup.controllers").exists():
        return MOUNT  # v2: every group has cgroup.freeze (but the root)
    return None


def _is_v2(group: Path) -> bool:
    return not (group / "freezer.state").exists()


def freeze(group: Path, pids: list[int], wait: float = 10.0) -> None:
    """Move `pids` into `group` and freeze it; returns once the kernel says frozen.
    Raises OSError if it does not within `wait` seconds (the group is thawed again)."""
    for pid in pids:
        join(group, pid)
    _write_state(group, frozen=True)
    deadline = time.monotonic() + wait
    while not is_frozen(group):
        if time.monotonic() >= deadline:
            thaw(group)
            raise OSError(f"{group} did not freeze within {wait:g} s")
        time.sleep(0.02)


def join(group: Path, pid: int) -> None:
    """Move one process (all its threads) into `group`; one already gone is fine."""
    try:
        (group / "cgroup.procs").write_text(str(pid))
    except ProcessLookupError:
        pass


def thaw(group: Path) -> None:
    """Let every process of the group (and of the groups under it) run again."""
    for folder in [group, *sorted(p for p in group.rglob("*") if p.is_dir())]:
        try:
            _write_state(folder, frozen=False)
        except OSError:
            continue  # gone meanwhile, or the v2 root: nothing frozen there


def is_frozen(group: Path) -> bool:
    """The kernel's word: every task of the group is stopped."""
    try:
        if _is_v2(group):
            return "frozen 1" in (group / "cgroup.events").read_text().splitlines()
        return (group / "freezer.state").read_text().strip() == "FROZEN"
    except OSError:
        return False


def members(group: Path) -> set[int]:
    """The processes in the group itself."""
    try:
        return {int(p) for p in (group / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def _write_state(group: Path, frozen: bool) -> None:
    if _is_v2(group):
        (group / "cgroup.freeze").write_text("1" if frozen else "0")
    else:
        (group / "freezer.state").write_text("FROZEN" if frozen else "THAWED")


def is_group(folder: Path) -> bool:
    """A folder of the freezer hierarchy (v1) or of the unified one (v2)."""
    return (folder / "freezer.state").exists() or (folder / "cgroup.freeze").exists()
