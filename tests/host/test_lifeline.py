"""The lifeline and the leftovers: whatever kills a harness, its runs go with it.

Each test starts a real harness process (a Python program that registers a
run with its lifeline and then makes what runs make: marked processes, one
of them SIGSTOPped, a network of simulated nodes, a fault filesystem mount),
kills it, and looks at what is left on the machine (also an OOM fault's memory
cgroup with a process in it, and a deep run's short TMPDIR link).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import REPO, lifeline_watcher, signal_and_wait

from torchchaos.faults.faultfs.mount import Mount
from torchchaos.faults.faultfs.mount import unavailable_reason as fuse_unavailable
from torchchaos.host import cgroups, leftovers, lifeline, netns, owners
from torchchaos.host.mounts import mounts_under

# it orphans runs and lists what is left: alone on the host under pytest -n, all such
# tests on one worker one after the other (conftest)
pytestmark = [pytest.mark.host_exclusive, pytest.mark.xdist_group("host_exclusive")]

BOUND = 10.0  # seconds


HARNESS = """
import os, signal, subprocess, sys, time
from pathlib import Path
from torchchaos.host import lifeline
run_id, folder = sys.argv[1], Path(sys.argv[2])
{own}
marked = {{**os.environ, "TORCHCHAOS_RUN_ID": run_id}}
sleeper = subprocess.Popen(["sleep", "600"], env=marked, start_new_session=True)
stopped = subprocess.Popen(["sleep", "600"], env=marked, start_new_session=True)
os.kill(stopped.pid, signal.SIGSTOP)
if "network" in sys.argv:
    from torchchaos.host.netns import Network
    Network(run_id, 2).create()
if "mount" in sys.argv:
    from torchchaos.faults.faultfs.mount import Mount
    Mount(folder / "mnt", folder / "state", folder / "fs.jsonl", run_id).start()
if "cgroup" in sys.argv:  # the oom fault's: the stopped process confined in it
    from torchchaos.host import cgroups
    group = cgroups.create_run_group(cgroups.memory_root(), run_id)
    cgroups.confine(group, "rank-1", 1 << 30, stopped.pid)
if "shortcut" in sys.argv:  # a deep run directory's short TMPDIR
    from torchchaos.host import shortcuts
    deep = folder / ("deep-" * 20)
    deep.mkdir()
    shortcuts.short_tmp(deep, run_id)
print("ready", flush=True)
time.sleep(600)
"""


class Harness:
    """A harness process owning one run; `kill()` SIGKILLs it (and its watcher)."""

    def __init__(self, tmp: Path, *extras: str, watcher: bool = True,
                 environ: dict[str, str] | None = None, run_id: str = "") -> None:
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.folder = tmp.resolve()
        own = ("lifeline.own(run_id, folder)" if watcher else
               "from torchchaos.host.owners import HarnessLock\n"
               "lock = HarnessLock(); lock.own(run_id, folder)")
        script = tmp / f"harness-{self.run_id}.py"
        script.write_text(textwrap.dedent(HARNESS.format(own=own)))
        self.proc = subprocess.Popen(
            [sys.executable, str(script), self.run_id, str(tmp), *extras],
            env={**os.environ, "PYTHONPATH": str(REPO), **(environ or {})}, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line.strip() == "ready", line + self.proc.stderr.read()  # type: ignore[union-attr]

    def mine(self) -> list[leftovers.Leftover]:
        return [x for x in leftovers.inventory()
                if x.run and self.run_id.startswith(x.run)
                or x.kind == "mount" and x.name.startswith(str(self.folder))]

    def watcher(self) -> int | None:
        return lifeline_watcher(self.proc.pid)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        signal_and_wait(self.proc, sig, "the harness")  # killed, its watcher cleans up

    def lock_files(self) -> list[Path]:
        return [p for p in owners.lock_files() if p.name.startswith(f"{self.proc.pid}-")]


def wait_until_gone(harness: Harness) -> float:
    """Seconds until nothing of the harness's run is left, its watcher included; fails
    after BOUND."""
    start = time.monotonic()
    while harness.mine() or harness.lock_files() or harness.watcher() is not None:
        assert time.monotonic() - start < BOUND, (
            f"left {BOUND:g} s after the harness died: {harness.mine()} {harness.lock_files()}"
            f" watcher {harness.watcher()}")
        time.sleep(0.05)
    return time.monotonic() - start


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchchaos.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def extras() -> list[str]:
    """What this machine can make besides processes (a short TMPDIR link: always)."""
    return ([] if netns.unavailable_reason() else ["network"]) + (
        [] if fuse_unavailable() else ["mount"]) + (
        [] if cgroups.memory_root() is None else ["cgroup"]) + ["shortcut"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT],
                         ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_a_dead_harness_takes_its_runs_along(tmp_path, sig):
    harness = Harness(tmp_path, *extras())
    made = {x.kind for x in harness.mine()}
    assert {"process", "shortcut", *(["netns", "link"] if "network" in extras() else []),
            *(["mount"] if "mount" in extras() else []),
            *(["cgroup"] if "cgroup" in extras() else [])} <= made
    assert any(psutil.Process(int(x.name)).status() == psutil.STATUS_STOPPED
               for x in harness.mine() if x.kind == "process")
    harness.kill(sig)  # none of these signals is handled: the program just dies
    wait_until_gone(harness)


def test_a_dead_node_harness_of_a_job_across_machines_takes_its_link_along(tmp_path):
    """A node's harness (`torchchaos node`, as a Slurm job's step runs it) names its run
    after the job's: its deep TMPDIR link is found and removed too (one of a node the
    scheduler killed stayed in the state folder before)."""
    harness = Harness(tmp_path, "shortcut",
                      run_id=f"slurm-{uuid.uuid4().hex[:8]}-node-1-{uuid.uuid4().hex[:8]}")
    assert {"process", "shortcut"} <= {x.kind for x in harness.mine()}
    harness.kill(signal.SIGKILL)
    wait_until_gone(harness)


def test_a_harness_that_ends_normally_leaves_no_watcher_and_no_lock(tmp_path):
    script = tmp_path / "h.py"
    script.write_text("from torchchaos.host import lifeline\nlifeline.own('0123456789ab')\n")
    subprocess.run([sys.executable, str(script)], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + BOUND
    while any("0123456789ab" in p.read_text() for p in owners.lock_files()):
        assert time.monotonic() < deadline, "the watcher did not remove its lock file"
        time.sleep(0.05)


def test_the_watcher_is_outside_the_harness_tree_and_group(tmp_path):
    harness = Harness(tmp_path)
    watcher = harness.watcher()
    assert watcher is not None
    assert watcher not in [p.pid for p in psutil.Process(harness.proc.pid).children(True)]
    assert os.getpgid(watcher) != os.getpgid(harness.proc.pid)
    harness.kill()
    wait_until_gone(harness)


def test_while_the_harness_lives_nothing_of_it_is_stale(tmp_path):
    harness = Harness(tmp_path, *extras())
    try:
        stale = leftovers.stale(leftovers.inventory())
        assert not [x for x in stale if x.run and harness.run_id.startswith(x.run)
                    or x.kind == "mount" and x.name.startswith(str(harness.folder))]
        done = cli("clean", "--yes", cwd=tmp_path)
        assert "left alone" in done.stdout and str(harness.proc.pid) in done.stdout
        assert {x.kind for x in harness.mine()} >= {"process"}  # untouched
    finally:
        harness.kill()
    wait_until_gone(harness)


def _orphan(tmp: Path) -> Harness:
    """A run whose harness and watcher were both killed: nothing removed it."""
    # no lifeline at all; a fault filesystem would unmount anyway (its daemon dies with
    # its parent and libfuse's auto_unmount follows)
    harness = Harness(tmp, *[e for e in extras() if e != "mount"], watcher=False,
                      environ={lifeline.OFF_ENV: "1"})
    harness.kill()
    assert harness.mine(), "its processes (and network, mount) should outlive it"
    return harness


def test_clean_lists_what_a_dead_harness_left_and_removes_it_with_yes(tmp_path):
    orphan = _orphan(tmp_path)
    listed = cli("clean", cwd=tmp_path)
    assert listed.returncode == 1, listed.stdout + listed.stderr
    assert f"of run {orphan.run_id}" in listed.stdout and "clean --yes" in listed.stdout
    assert f"lock {orphan.lock_files()[0]}" in listed.stdout
    assert orphan.mine(), "listing must remove nothing"
    removed = cli("clean", "--yes", cwd=tmp_path)
    assert removed.returncode == 0 and "removed" in removed.stdout, removed.stdout
    assert orphan.mine() == [] and orphan.lock_files() == []
    again = cli("clean", cwd=tmp_path)
    assert again.returncode == 0 and "nothing left behind" in again.stdout


def test_the_next_harness_start_removes_what_a_dead_one_left(tmp_path):
    orphan = _orphan(tmp_path)
    nxt = Harness(tmp_path)
    try:
        assert orphan.mine() == [] and orphan.lock_files() == []
        said = nxt.proc.stderr.readline()  # type: ignore[union-attr]
        assert "removed" in said and "leftover(s) of dead harnesses" in said
    finally:
        nxt.kill()
    wait_until_gone(nxt)


def test_the_pytest_plugin_removes_leftovers_at_session_start(tmp_path):
    orphan = _orphan(tmp_path)
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_nothing.py")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torchchaos: removed" in done.stdout
    assert orphan.mine() == [] and orphan.lock_files() == []


def test_a_lock_is_live_exactly_while_its_process_lives(tmp_path):
    folder = tmp_path / "state"
    code = ("import sys, time\nfrom pathlib import Path\nfrom torchchaos.host.owners import"
            " HarnessLock\nHarnessLock(Path(sys.argv[1])).own('feedfacecafe')\n"
            "print('ok', flush=True)\ntime.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)},
                              stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "ok"  # type: ignore[union-attr]
    (path,) = owners.lock_files(folder)
    assert owners.is_live(path) and owners.owners(folder).owns_run("feedfacecafe")
    holder.kill()
    holder.wait()
    assert not owners.is_live(path)
    assert [f.runs for f in owners.owners(folder).dead] == [{"feedfacecafe"}]


@pytest.mark.skipif(bool(fuse_unavailable()), reason=fuse_unavailable())
def test_a_mount_no_live_harness_owns_is_stale_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv(lifeline.OFF_ENV, "1")  # this process does not register it
    mount = Mount(tmp_path / "mnt", tmp_path / "state", tmp_path / "fs.jsonl").start()
    try:
        stale = [x for x in leftovers.stale(leftovers.inventory())
                 if x.kind == "mount" or x.run == mount.owner]
        assert {x.kind for x in stale} == {"mount", "process"}  # and its daemon
        assert leftovers.remove(stale) == []
        assert mounts_under(tmp_path) == [] and not mount.mounted()
    finally:
        mount.close()


def test_a_harness_that_cannot_have_a_lifeline_says_so_and_runs_on(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # the state folder cannot be made below a file
    script = tmp_path / "h.py"
    script.write_text("from torchchaos.host import lifeline\nlifeline.own('0123456789ab')\n"
                      "lifeline.own('ba9876543210')\nprint('ran on')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO),
                                           owners.STATE_ENV: str(blocker / "state")})
    assert done.returncode == 0 and done.stdout == "ran on\n", done.stderr
    assert done.stderr.count("no lifeline for this harness") == 1  # said once
