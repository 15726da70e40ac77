"""Where an owned engine lives (`docker-<id>` in the state folder), which cgroups its
containers run in, and removing what a dead one left.

Beside `docker/`, not in it: `torchchaos.host.leftovers` lists an engine's remains
with it, and the engine (`docker/engine.py`) owns its folder on the lifeline, which
sweeps leftovers, so the whole of `docker/` stands above the lifeline and this below.

The daemon, its containerd and their shims carry the run id mark in their environment;
a container's processes do not (the image's environment is theirs), so the engine puts
every container under one cgroup of its own, `torchchaos-docker-<id>`, and its processes
are found there."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from torchchaos.host.owners import RUN_ID, state_dir

PREFIX = "docker-"
OURS = re.compile(rf"^{PREFIX}({RUN_ID})$")
CGROUP_PREFIX = "torchchaos-docker-"
CGROUPS = Path("/sys/fs/cgroup")


def owned_root(engine_id: str) -> Path:
    return state_dir() / f"{PREFIX}{engine_id}"


def cgroup_parent(engine_id: str) -> str:
    return f"/{CGROUP_PREFIX}{engine_id}"


def leftovers() -> list[tuple[str, str]]:
    """(folder, engine id) of every owned engine's folder in the state folder."""
    try:
        entries = sorted(state_dir().iterdir())
    except FileNotFoundError:
        return []
    return [(str(p), m.group(1)) for p in entries if (m := OURS.match(p.name)) and p.is_dir()]


def _groups(engine_id: str) -> list[Path]:
    """The engine's cgroup folders, in every hierarchy (cgroup v1) or the unified one."""
    name = f"{CGROUP_PREFIX}{engine_id}"
    return [g for g in [CGROUPS / name, *CGROUPS.glob(f"*/{name}")] if g.is_dir()]


def container_groups(engine_id: str, container_id: str) -> list[Path]:
    """One container's cgroup folders, in every hierarchy: a process that joins them all
    is the container's as much as its own first process is (`docker pause` freezes it,
    `docker stats` counts it)."""
    return [g / container_id for g in _groups(engine_id) if (g / container_id).is_dir()]


def thaw(engine_id: str) -> None:
    """Unpause every container of the engine from outside it: its processes, SIGKILLed
    while paused, die only once thawed (cgroup freezer)."""
    from torchchaos.host import freezer

    for group in _groups(engine_id):
        if group.parent.name == "freezer" or group.parent == CGROUPS:
            freezer.thaw(group)


def container_pids(engine_id: str) -> list[int]:
    """Every process in a container of the engine."""
    pids: set[int] = set()
    for group in _groups(engine_id):
        for procs_file in group.rglob("cgroup.procs"):
            try:
                pids |= {int(p) for p in procs_file.read_text().split()}
            except (OSError, ValueError):
                continue
    return sorted(pids)


def mounts_under(root: Path) -> list[str]:
    """The mountpoints at or under `root` (overlay layers, a namespace's nsfs, the data
    folder's own bind), deepest first: the order they come off in."""
    found = []
    prefix = str(root.absolute())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def remove(root: Path, engine_id: str) -> list[str]:
    """Unmount what is under the engine's folder, remove its cgroups and the folder, once
    its processes are gone. Returns what could not be removed, in words."""
    failures = []
    for point in mounts_under(root):
        done = subprocess.run(["umount", "-l", point], capture_output=True, text=True,
                              timeout=30)
        if done.returncode != 0 and point in mounts_under(root):
            failures.append(f"mount {point}: {done.stderr.strip()}")
    for group in _groups(engine_id):
        for folder in sorted(group.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if folder.is_dir():
                _rmdir(folder)
        _rmdir(group)
        if group.is_dir():
            failures.append(f"cgroup {group}: a process is still in it")
    if failures:  # the folder is how a sweep finds the engine again: kept for the next
        return failures
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        failures.append(f"folder {root} could not be removed")
    return failures


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass
