"""Everything a run can leave on the machine, found and removed.

A run leaves processes (ranks, torchrun agents, healers, fault filesystem
daemons: all carry the run's id in their environment), network namespaces,
veth links and a bridge (named after the run id; a partition's nftables
tables live inside the namespaces and go with them), fault filesystem mounts
(fsname `torchchaos-faultfs`, under the run directory), the memory cgroups of
an OOM fault (`torchchaos.host.cgroups`, named after the run id), the short
link to a deep run's temporary folder (`torchchaos.host.shortcuts`), the folder of a
Slurm cluster a harness started (`torchchaos.host.slurm`: its daemons are processes
marked with the cluster's id as run id), the folder of a Docker engine a harness
started (`torchchaos.host.docker`: its daemon marked as a cluster's are, its
containers' processes found in its cgroup, its layers mounted under its folder, its
networks' bridges named as a run's), and the lock file of
its harness (`torchchaos.host.owners`). `inventory()` lists all of it; `stale`
says what is a leftover; `remove` takes things away in the order that works:
processes first (they keep mounts and cgroups busy), then mounts, then
cgroups, then the network, then the links, then the lock files.

A thing is a leftover only if its own harness is provably gone, wherever that
harness kept its lock file:
- a process names its harness's lock file (`env.LOCK`): a leftover exactly
  when that file is not live. One without the variable (a run of an older
  version) is judged by its run id, as mounts and networks are;
- a mount, cgroup, namespace or link is owned when a live lock file lists its run or
  folder: one of this state folder, one a process of any run names, or, when
  those leave something unowned, any lock file held open on the machine. That
  last look closes the race of a live harness between two launches: its
  network exists, no process of its run does, its lock is elsewhere; it is
  still held open by the harness, so it is found;
- processes and mounts of other users are never listed, so never touched
  (also by root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from torchchaos import env
from torchchaos.host import cgroups, freezer, netns, procs, shortcuts
from torchchaos.host import cluster_folders as slurm
from torchchaos.host import engine_folders as docker
from torchchaos.host.owners import (
    LockFile,
    Owners,
    held_anywhere,
    is_lock_path,
    owners,
    read_live,
)

FSNAME = "torchchaos-faultfs"  # the fault filesystem's mounts show this source
ORDER = ("slurmjob", "process", "mount", "cgroup", "netns", "link", "shortcut", "cluster",
         "engine", "lock")
MARKERS = (env.RUN_ID, env.HELPER)
REMOVERS = {"mount": ["fusermount3", "-u", "-z"], "netns": ["ip", "netns", "del"],
            "link": ["ip", "link", "del"]}


@dataclass(frozen=True)
class Leftover:
    kind: str  # one of ORDER
    name: str  # pid, mountpoint, namespace, link or lock file path
    run: str = ""  # the run id it carries (a prefix for network names)
    detail: str = ""  # a process's command line, a dead harness's pid
    lock: str = ""  # a process's harness's lock file (env.LOCK), when it names one

    def describe(self) -> str:
        run = f" of run {self.run}" if self.run else ""
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.kind} {self.name}{run}{detail}"


def inventory() -> list[Leftover]:
    """Everything of any torchchaos run that exists now, live or not."""
    found = (_processes() + _mounts() + _cgroups() + _network() + _shortcuts() + _clusters()
             + _engines() + _slurm_jobs())
    return sorted(found, key=lambda x: (ORDER.index(x.kind), x.name))


def stale(found: list[Leftover], who: Owners | None = None) -> list[Leftover]:
    """What no live harness owns (see the module's words), plus the lock files of dead
    harnesses: this state folder's, and those that the processes found name. Read the
    owners after listing: a run is registered before anything of it exists."""
    who = who if who is not None else owners()
    named = {x.lock for x in found if x.lock}
    who = who.plus(read_live(named))
    orphans = [x for x in found if not _owned(x, who)]
    if orphans:  # the costlier look, only to confirm
        who = who.plus(held_anywhere())
        orphans = [x for x in orphans if not _owned(x, who)]
    dead = who.dead + [LockFile.read(Path(p)) for p in sorted(named)
                       if not who.holds(p) and Path(p).exists()]
    return orphans + [_dead_lock(f) for f in {f.path: f for f in dead}.values()]


def _dead_lock(lock: LockFile) -> Leftover:
    said = f"; its watcher said: {lock.notes[-1]}" if lock.notes else ""
    return Leftover("lock", str(lock.path), detail=f"harness pid {lock.pid}, dead{said}")


def of_lock(found: list[Leftover], lock: LockFile) -> list[Leftover]:
    """What belongs to the runs and folders one harness's file lists."""
    return [x for x in found if _owned(x, Owners([lock], []))]


def _owned(item: Leftover, who: Owners) -> bool:
    if item.kind == "mount":
        return who.owns_path(item.name)
    if item.lock:  # its own harness's lock decides, whatever else lists its run
        return who.holds(item.lock)
    return bool(item.run) and who.owns_run(item.run)


def remove(items: list[Leftover], timeout: float = 10.0) -> list[str]:
    """Take the things away (processes: SIGKILL, also when stopped, until none of those
    runs is left). Returns what could not be removed, in words."""
    failures: list[str] = []
    _thaw(items)
    runs = {x.run for x in items if x.kind == "process"}
    if runs:
        failures += _kill(runs, timeout)
    for item in sorted(items, key=lambda x: ORDER.index(x.kind)):
        if item.kind == "lock":
            Path(item.name).unlink(missing_ok=True)
        elif item.kind == "cgroup" and not cgroups.remove(Path(item.name), wait=timeout):
            failures.append(f"{item.describe()}: a process is still in it")
        elif item.kind == "shortcut":
            Path(item.name).unlink(missing_ok=True)
        elif item.kind == "cluster":
            failures += _remove_folder(item)
        elif item.kind == "slurmjob":
            failures += slurm.cancel_noted(item.name)
        elif item.kind == "engine":
            failures += docker.remove(Path(item.name), item.run)
        elif item.kind in REMOVERS and _exists(item):
            failures += _run_quietly([*REMOVERS[item.kind], item.name], item)
    return failures


def _thaw(items: list[Leftover]) -> None:
    """Let frozen processes run (a node frozen by the freeze fault, a paused container):
    SIGKILL reaches a frozen process only once it is thawed."""
    for item in items:
        if item.kind == "cgroup":
            freezer.thaw(Path(item.name))
        elif item.kind == "engine" and item.run:
            docker.thaw(item.run)


def _remove_folder(item: Leftover) -> list[str]:
    """A cluster's folder; still there means a dying daemon wrote into it meanwhile
    (slurmctld saves its state on the way down): said, so the next round tries again."""
    shutil.rmtree(item.name, ignore_errors=True)
    return [f"{item.describe()}: still there after removal"] if _exists(item) else []


def _exists(item: Leftover) -> bool:
    """Still there? A mount goes with its killed daemon (auto_unmount), a veth with its
    namespace's end."""
    if item.kind == "mount":
        return any(m.name == item.name for m in _mounts())
    if item.kind == "cgroup":
        return Path(item.name).is_dir()
    if item.kind == "shortcut":
        return Path(item.name).is_symlink()
    if item.kind in ("cluster", "engine"):
        return Path(item.name).is_dir()
    return any(n.kind == item.kind and n.name == item.name for n in _network())


def _kill(runs: set[str], timeout: float) -> list[str]:
    """SIGKILL whatever carries those runs' marks until none is left."""
    _, survivors = procs.kill_until_gone(
        lambda: [int(x.name) for x in _processes() if x.run in runs], timeout)
    return [f"processes {survivors} survived SIGKILL"] if survivors else []


def _run_quietly(command: list[str], item: Leftover) -> list[str]:
    """Run a removal; a failure counts only if the thing is still there."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"{item.describe()}: {exc}"]
    if done.returncode != 0 and _exists(item):
        return [f"{item.describe()}: {done.stderr.strip()}"]
    return []


def _processes() -> list[Leftover]:
    """This user's marked processes (procs.env_vars skips other users')."""
    found = _cluster_processes() + _engine_processes()
    seen = {int(x.name) for x in found}
    for pid, values in procs.env_vars((*MARKERS, env.LOCK)).items():
        if pid in seen:
            continue
        run = next((values[m] for m in MARKERS if m in values), None)
        if run is None:
            continue  # env.LOCK alone marks nothing
        lock = values.get(env.LOCK, "")
        state = "stopped; " if procs.pid_stopped(pid) else ""
        found.append(Leftover("process", str(pid), run, state + _command(Path(f"/proc/{pid}")),
                              lock if is_lock_path(lock) else ""))
    return found


def _cluster_processes() -> list[Leftover]:
    """What runs on the nodes of an owned Slurm cluster: each slurmd's steps clear their
    environment (no mark) and leave its tree, but hold its node's log open; their tasks
    are in their trees."""
    found = []
    for folder, run in slurm.leftovers():
        logs = sorted((Path(folder) / "log").glob("slurmd-*.log"))
        holders = procs.holding(*logs) if logs else []
        found += [Leftover("process", str(pid), run, _command(Path(f"/proc/{pid}")))
                  for pid in procs.tree(holders)]
    return found


def _engine_processes() -> list[Leftover]:
    """What runs in the containers of an owned Docker engine: a container's processes
    carry the image's environment, not the marks, but live in the engine's cgroup."""
    return [Leftover("process", str(pid), run, _command(Path(f"/proc/{pid}")))
            for _, run in docker.leftovers() for pid in docker.container_pids(run)]


def _command(proc_dir: Path) -> str:
    try:
        words = (proc_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    words = [w.decode(errors="replace") for w in words if w]
    if not words:
        return ""
    return " ".join([Path(words[0]).name, *words[1:]])[:100]  # python, not its full path


def _mounts() -> list[Leftover]:
    """This user's fault filesystem mounts: mountinfo's fields after " - " are type,
    source, options; a FUSE mount's options name the user who mounted it (user_id=)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields = after.split()
        if len(fields) >= 2 and fields[1] == FSNAME and _mine(fields[2:]):
            found.append(Leftover("mount", before.split()[4].replace("\\040", " ")))
    return found


def _mine(options: list[str]) -> bool:
    users = [o for o in ",".join(options).split(",") if o.startswith("user_id=")]
    return all(u == f"user_id={os.getuid()}" for u in users)


def _cgroups() -> list[Leftover]:
    return [Leftover("cgroup", folder, run) for folder, run in cgroups.leftovers()]


def _shortcuts() -> list[Leftover]:
    return [Leftover("shortcut", link, run) for link, run in shortcuts.leftovers()]


def _clusters() -> list[Leftover]:
    return [Leftover("cluster", folder, run) for folder, run in slurm.leftovers()]


def _engines() -> list[Leftover]:
    """The folders of Docker engines a harness started (`torchchaos.host.docker`): their
    layers' mounts, their cgroups and the folder go together."""
    return [Leftover("engine", folder, run) for folder, run in docker.leftovers()]


def _slurm_jobs() -> list[Leftover]:
    """Slurm jobs a harness submitted and noted (`torchchaos.harness.scheduler`)."""
    return [Leftover("slurmjob", note, run) for note, run in slurm.job_leftovers()]


def _network() -> list[Leftover]:
    found = []
    for item in netns.leftovers():
        kind, name = item.split(" ", 1)
        match = netns.OURS.match(name)
        found.append(Leftover(kind, name, match.group(1) if match else ""))
    return found
