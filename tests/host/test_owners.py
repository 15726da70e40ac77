"""Ownership is per harness, not per state folder: a run is a leftover only if its own
harness is provably gone, wherever that harness kept its lock file, and runs of other
users are never touched.

Each test starts real harness processes (a Python program that registers a run with
its lifeline and makes marked processes through the runner's own `job_environment`, a
network, a fault filesystem), each with its own TORCHCHAOS_STATE_DIR, and runs the real
sweeps: `torchchaos clean` and a harness start.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import REPO, lifeline_watcher

from torchchaos import env
from torchchaos.faults.faultfs.mount import unavailable_reason as fuse_unavailable
from torchchaos.host import leftovers, lifeline, netns, owners, procs

# it orphans runs and lists what is left: alone on the host under pytest -n, all such
# tests on one worker one after the other (conftest)
pytestmark = [pytest.mark.host_exclusive, pytest.mark.xdist_group("host_exclusive")]

BOUND = 15.0  # seconds for a sweep's or a watcher's removal to show
ROUND = lifeline.ROUND_SECONDS  # one round of the watcher's SIGKILLs

HARNESS = """
import os, subprocess, sys, time
from pathlib import Path
from torchchaos.harness.runner import job_environment
from torchchaos.host import lifeline
from torchchaos.scenario.model import Scenario
run_id, folder, parts = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
lifeline.own(run_id, folder)
marked = job_environment(Scenario(script="x.py"), folder, run_id, 0, 0.0, None)
if "procs" in parts:
    subprocess.Popen(["sleep", "600"], env=marked, start_new_session=True)
if "network" in parts:
    from torchchaos.host.netns import Network
    Network(run_id, 2).create()
if "mount" in parts:
    from torchchaos.faults.faultfs.mount import Mount
    Mount(folder / "mnt", folder / "state", folder / "fs.jsonl", run_id).start()
if "reader" in parts:  # reads a file whose read the test holds up
    subprocess.Popen(["cat", str(folder / "stall" / "f")], env=marked,
                     stdout=subprocess.DEVNULL, start_new_session=True)
print("ready", flush=True)
time.sleep(600)
"""

# A filesystem whose one file's read is answered only once `release` exists. A process
# whose read the daemon has taken waits for the answer in the kernel, uninterruptibly: it
# survives SIGKILL until then, as a rank stuck in a driver or a hung filesystem does.
STALL_FS = """
import errno, stat, sys, time
from pathlib import Path
import mfusepy as fuse
mountpoint, release, reading = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
class Stall(fuse.Operations):
    use_ns = True
    def getattr(self, path, fh=None):
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
        if path == "/f":
            return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": 1}
        raise fuse.FuseOSError(errno.ENOENT)
    def readdir(self, path, fh):
        return [".", "..", "f"]
    def read(self, path, size, offset, fh):
        reading.touch()
        end = time.monotonic() + 120
        while not release.exists() and time.monotonic() < end:
            time.sleep(0.05)
        return b"x"[offset:offset + size]
# direct_io: a read is one request the reader waits on, not a page-cache fill (killable)
fuse.FUSE(Stall(), mountpoint, foreground=True, auto_unmount=True, direct_io=True)
"""


def state_env(state: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), owners.STATE_ENV: str(state)}


class Harness:
    """A harness process with its lock file in `state`, owning one run in `folder`."""

    def __init__(self, folder: Path, state: Path, *parts: str) -> None:
        self.run_id = uuid.uuid4().hex[:12]
        self.folder = folder.resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.state = state
        script = folder / f"harness-{self.run_id}.py"
        script.write_text(textwrap.dedent(HARNESS))
        self.proc = subprocess.Popen(
            [sys.executable, str(script), self.run_id, str(self.folder), *parts],
            env=state_env(state), text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line.strip() == "ready", line + self.proc.stderr.read()  # type: ignore[union-attr]

    def mine(self) -> set[tuple[str, str]]:
        return {(x.kind, x.name) for x in leftovers.inventory()
                if x.run and self.run_id.startswith(x.run)
                or x.kind == "mount" and x.name.startswith(str(self.folder))}

    def lock(self) -> Path | None:
        found = [p for p in owners.lock_files(self.state)
                 if p.name.startswith(f"{self.proc.pid}-")]
        return found[0] if found else None

    def watcher(self) -> int | None:
        return lifeline_watcher(self.proc.pid)

    def kill(self, watcher_too: bool = False) -> None:
        """SIGKILL the harness (first its watcher, when `watcher_too`: nothing removes the
        run then but a sweep)."""
        watcher = self.watcher() if watcher_too else None
        if watcher is not None:
            os.kill(watcher, signal.SIGKILL)
            while psutil.pid_exists(watcher) and psutil.Process(watcher).status() != "zombie":
                time.sleep(0.02)
        self.proc.kill()
        self.proc.wait(timeout=30)

    def wait_until_gone(self, bound: float = BOUND) -> None:
        deadline = time.monotonic() + bound
        while self.mine() or self.lock() is not None:
            assert time.monotonic() < deadline, f"left: {self.mine()} lock {self.lock()}"
            time.sleep(0.1)


def clean(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchchaos.cli", "clean", *args],
                          capture_output=True, text=True, timeout=120, env=state_env(state))


def extras() -> list[str]:
    return ([] if netns.unavailable_reason() else ["network"]) + (
        [] if fuse_unavailable() else ["mount"])


@pytest.mark.parametrize("parts", [("procs", "mount", "network"), ("network",)],
                         ids=["running", "between-launches"])
def test_a_live_run_under_another_state_folder_survives_clean_and_a_harness_start(
        tmp_path, parts):
    parts = tuple(p for p in parts if p == "procs" or p in extras())
    if not parts:
        pytest.skip("this machine can make neither a network nor a fault filesystem")
    live = Harness(tmp_path / "run", tmp_path / "A", *parts)
    other = None
    try:
        made = live.mine()
        assert made, "the run should have made something"
        listed = clean(tmp_path / "B")
        assert live.run_id[:8] not in listed.stdout and str(live.folder) not in listed.stdout, (
            listed.stdout)
        # and it is said to be left alone, with where its harness keeps its lock
        assert f"its lock is in {(tmp_path / 'A').resolve()}" in listed.stdout, listed.stdout
        clean(tmp_path / "B", "--yes")
        assert live.mine() == made
        other = Harness(tmp_path / "other", tmp_path / "B")  # its start sweeps
        assert live.mine() == made and owners.is_live(live.lock())  # type: ignore[arg-type]
    finally:
        for harness in (other, live):
            if harness is not None:
                harness.kill()
                harness.wait_until_gone()


@pytest.mark.parametrize("sweep", ["clean", "start"])
def test_a_run_whose_harness_was_killed_is_cleaned_from_another_state_folder(tmp_path, sweep):
    dead = Harness(tmp_path / "run", tmp_path / "A", "procs",
                   *[p for p in extras() if p == "network"])
    lock = dead.lock()
    dead.kill(watcher_too=True)
    assert dead.mine() and lock is not None and not owners.is_live(lock)
    if sweep == "clean":
        listed = clean(tmp_path / "B")
        assert f"of run {dead.run_id}" in listed.stdout and f"lock {lock}" in listed.stdout, (
            listed.stdout)
        assert clean(tmp_path / "B", "--yes").returncode == 0
    else:
        other = Harness(tmp_path / "other", tmp_path / "B")
        other.kill()
        other.wait_until_gone()
    assert dead.mine() == set() and not lock.exists()


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to start a process as another user")
def test_a_process_of_another_user_is_never_listed_nor_touched(tmp_path):
    run_id = uuid.uuid4().hex[:12]
    dead_lock = tmp_path / "1-0123abcd.lock"  # a lock file nobody holds
    dead_lock.write_text("")
    marks = [{env.RUN_ID: run_id}, {env.RUN_ID: run_id, env.LOCK: str(dead_lock)}]
    theirs = [subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                "--clear-groups", "sleep", "600"], env={**os.environ, **mark})
              for mark in marks]
    other = None
    try:
        for proc in theirs:
            _wait_for_user(proc.pid, NOBODY)
        assert not {str(p.pid) for p in theirs} & {x.name for x in leftovers.inventory()}
        listed = clean(tmp_path / "B")
        assert run_id not in listed.stdout, listed.stdout
        clean(tmp_path / "B", "--yes")
        other = Harness(tmp_path / "other", tmp_path / "B")  # its start sweeps
        assert [p.poll() for p in theirs] == [None, None]
    finally:
        for proc in theirs:
            proc.kill()
            proc.wait(timeout=30)
        if other is not None:
            other.kill()
            other.wait_until_gone()


def _wait_for_user(pid: int, uid: int) -> None:
    """Until setpriv has switched to `uid` and run its program."""
    deadline = time.monotonic() + 10
    proc = psutil.Process(pid)
    while proc.uids().real != uid or proc.cmdline()[:1] != ["sleep"]:
        assert time.monotonic() < deadline, "setpriv did not switch users"
        time.sleep(0.02)


@pytest.mark.skipif(bool(fuse_unavailable()), reason=fuse_unavailable())
def test_the_watcher_keeps_killing_while_a_process_of_its_runs_is_left(tmp_path):
    folder = (tmp_path / "run").resolve()
    (folder / "stall").mkdir(parents=True)
    release, reading = folder / "release", folder / "reading"
    stall = subprocess.Popen([sys.executable, "-c", STALL_FS, str(folder / "stall"),
                              str(release), str(reading)], env=state_env(tmp_path / "none"),
                             start_new_session=True)  # no run's: no sweep removes it
    harness = None
    try:
        _wait(lambda: os.path.ismount(folder / "stall"), "the stalling filesystem to mount")
        harness = Harness(folder, tmp_path / "A", "reader")
        lock, watcher = harness.lock(), harness.watcher()
        assert lock is not None and watcher is not None
        _wait(reading.exists, "the reader's read to reach the filesystem")
        harness.kill()
        # one round of SIGKILLs (10 s) ends with the reader alive: the watcher says so and
        # goes on (it used to give up here, the reader alive, the lock file kept)
        _wait(lambda: _said(lock) or not psutil.pid_exists(watcher),
              "the watcher to say what survived", ROUND + BOUND)
        assert psutil.pid_exists(watcher) and harness.mine(), "the watcher gave up"
        assert owners.is_live(lock)  # held by the watcher: no sweep competes meanwhile
        release.touch()
        harness.wait_until_gone(ROUND + BOUND)
    finally:
        release.touch()
        if harness is not None:
            procs.reap(harness.run_id, [], timeout=30)
        subprocess.run(["fusermount3", "-u", "-z", str(folder / "stall")], capture_output=True)
        stall.kill()
        stall.wait(timeout=30)


def _said(lock: Path) -> bool:
    return any("survived SIGKILL" in n for n in owners.LockFile.read(lock).notes)


def _wait(condition: Callable[[], bool], what: str, bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"waited {bound:g} s for {what}"
        time.sleep(0.05)


def test_what_a_harness_starts_names_its_lock_file(tmp_path):
    """The runner's environment (and the fault filesystem daemon's) carries env.LOCK."""
    live = Harness(tmp_path / "run", tmp_path / "A", "procs", *[
        p for p in extras() if p == "mount"])
    try:
        found = [x for x in leftovers.inventory() if x.kind == "process"
                 and x.run == live.run_id]
        assert found and {x.lock for x in found} == {str(live.lock())}
        assert leftovers.stale(found, owners.Owners([], [])) == []  # no folder lists it
    finally:
        live.kill()
        live.wait_until_gone()
