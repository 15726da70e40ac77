"""End to end: a frozen node (torchchaos.faults.freeze) on namespace nodes.

The node's processes are frozen by the kernel's cgroup freezer and thawed after `for=`:
shorter than the target's collective timeout (5 s by default) the job only stalls and
goes on, bitwise; longer, the other node's collective times out, torchrun restarts,
and the job resumes. The stall is asserted from the history, by causality: the node
that was not frozen cannot finish the next step before the frozen one thaws. A harness
SIGKILLed while a node is frozen leaves nothing: its watcher thaws before it kills (a
frozen process dies only once thawed). Container nodes (`docker pause`):
tests/e2e/test_e2e_containers.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TARGET, chaos_processes

from torchchaos import env
from torchchaos.host import cgroups, freezer, netns, procs
from torchchaos.rundir.history import History

pytestmark = pytest.mark.skipif(bool(netns.unavailable_reason()),
                                reason=netns.unavailable_reason() or "ok")

STEPS = ["--steps", "12", "--ckpt-every", "4"]
TWO_NODES = {"nproc": 1, "nodes": 2, "network": "netns"}


def stall(run_dir: str, frozen_rank: int, other_rank: int, step: int) -> float:
    """Seconds from the frozen rank's `step` (it asks for the freeze after it) to the
    other rank's next step, which needs the frozen rank's part of the all-reduce."""
    history = History.of_run(Path(run_dir))
    asked = next(e["t"] for e in history.steps(frozen_rank) if e["step"] == step)
    done = next(e["t"] for e in history.steps(other_rank) if e["step"] == step + 1)
    return done - asked


def how_frozen(run_dir: str) -> list[str]:
    return [e["how"] for e in History.of_run(Path(run_dir)).events
            if e["ev"] == "nemesis_begin"]


def test_a_node_frozen_shorter_than_the_timeout_stalls_the_job_which_goes_on(chaos_run):
    report = chaos_run(TARGET, faults=["freeze:node=1,step=6,for=2"], args=STEPS,
                       expect="pass", **TWO_NODES)
    assert how_frozen(report.run_dir) == ["freezer cgroup"], report.table()
    assert report.restarts == 0, report.table()
    assert stall(report.run_dir, 1, 0, 6) >= 2.0, report.table()
    assert report.checks["deterministic_resume"]["ok"] is True, report.table()
    assert report.checks["no_orphans"]["ok"] is True, report.table()


def test_a_node_frozen_past_the_collective_timeout_makes_the_job_fail_over(chaos_run):
    report = chaos_run(TARGET, faults=["freeze:node=1,step=6,for=6"],
                       args=[*STEPS, "--timeout", "2"], expect="pass", **TWO_NODES)
    assert report.restarts >= 1, report.table()
    assert report.checks["deterministic_resume"]["ok"] is True, report.table()
    assert report.checks["no_orphans"]["ok"] is True, report.table()


def test_a_harness_killed_while_a_node_is_frozen_leaves_nothing(tmp_path_factory, tmp_path):
    out = tmp_path / "out"
    cache = tmp_path_factory.getbasetemp() / "torchchaos-cache"  # the plugin's: reference reused
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchchaos.cli", "run", "--nodes", "2", "--nproc", "1",
         "--network", "netns", "--out", str(out), "--cache-dir", str(cache),
         "--fault", "freeze:node=1,step=4,for=120", "--", str(TARGET), *STEPS],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    harness = out / "chaos" / "_chaos" / "history" / "harness.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and '"nemesis_begin"' not in _text(harness):
        time.sleep(0.2)
    assert '"nemesis_begin"' in _text(harness), "the node should be frozen"
    run_ids = {values[env.RUN_ID] for values in procs.env_vars((env.RUN_DIR, env.RUN_ID)).values()
               if values.get(env.RUN_DIR, "").startswith(str(tmp_path)) and env.RUN_ID in values}
    assert _groups(run_ids), "the frozen node's group is the run's"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while (chaos_processes(tmp_path) or _groups(run_ids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert chaos_processes(tmp_path) == []
    assert _groups(run_ids) == []


@pytest.mark.parametrize("spec, words", [
    ("freeze:node=1,step=6", "freeze needs for="),
    ("freeze:node=5,step=6,for=2", "node 5"),
])
def test_a_freeze_that_cannot_be_is_refused_in_one_line(tmp_path, spec, words):
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--nodes", "2", "--network", "netns",
         "--out", str(tmp_path / "o"), "--fault", spec, "--", str(TARGET)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "o").exists()


def test_a_freeze_needs_nodes_of_their_own(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--nodes", "2", "--network", "host",
         "--out", str(tmp_path / "o"), "--fault", "freeze:node=1,step=6,for=2", "--",
         str(TARGET)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert "freeze needs --network netns or docker" in done.stderr, done.stderr


def _groups(run_ids: set[str]) -> list[str]:
    """The freezer groups of those runs still there."""
    root = freezer.root()
    return [] if root is None else [str(cgroups.run_group(root, r)) for r in run_ids
                                    if cgroups.run_group(root, r).is_dir()]


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""
