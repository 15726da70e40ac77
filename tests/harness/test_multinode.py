"""Several machines, simulated on this one: two `torchchaos node` processes started
separately (as two machines would start them), a shared directory, `torchchaos gather`.

Node 0 and node 1 get distinct loopback addresses (127.0.0.1, 127.0.0.2), so the
rendezvous gives them group ranks 0 and 1 in that order, as it would two hosts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TARGET, chaos_processes

from torchchaos.harness import multinode
from torchchaos.host import netns
from torchchaos.rundir.history import HistoryWriter

CLI = [sys.executable, "-m", "torchchaos.cli"]
ARGS = [str(TARGET), "--steps", "20", "--ckpt-every", "5"]
KILL = ["--fault", "kill:node=1,step=12"]  # after the save at step 10


def environ() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def start_node(shared: Path, rank: int, port: int, options: list[str],
               args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "node", "--shared", str(shared), "--node-rank", str(rank), "--nnodes", "2",
         "--nproc", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--local-addr", f"127.0.0.{rank + 1}", "--timeout", "120",
         # a dead node is noticed after 3 s, not torch's 15: CI time
         "--rdzv-conf", "keep_alive_interval=1,keep_alive_max_attempt=3",
         *options, "--", *args],
        cwd=REPO, env=environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_pair(shared: Path, options: list[str] = (), args: list[str] = ARGS) -> list[int]:
    """Both nodes, started one after the other as two machines would; their exit codes."""
    port = netns.free_port()
    nodes = [start_node(shared, rank, port, list(options), args) for rank in (0, 1)]
    try:
        for node in nodes:
            node.communicate(timeout=180)
    finally:
        for node in nodes:  # SIGTERM: the harness reaps what it started
            if node.poll() is None:
                node.terminate()
                node.communicate(timeout=30)
    return [node.returncode for node in nodes]


def gather(run_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "gather", str(run_dir), "--wait", "5", *options],
                          cwd=REPO, env=environ(), capture_output=True, text=True, timeout=120)


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared directory holding the fault-free two-node run (run id 'reference')."""
    folder = tmp_path_factory.mktemp("shared")
    assert run_pair(folder) == [0, 0]
    return folder


def test_fault_free_pair_completes_and_gathers(shared: Path) -> None:
    result = gather(shared / "reference")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = report(shared / "reference")["checks"]
    assert checks["completes"]["ok"] and checks["no_orphans"]["ok"]
    streams = sorted(p.name for p in (shared / "reference/_chaos/history").iterdir())
    assert streams == ["harness-node-0.jsonl", "harness-node-1.jsonl",
                       "rank-0.jsonl", "rank-1.jsonl"]


def test_killed_node_is_relaunched_and_the_job_resumes(shared: Path) -> None:
    assert run_pair(shared, [*KILL, "--run-id", "kill"]) == [0, 0]
    run_dir = shared / "kill"
    done = multinode.finished_nodes(run_dir)
    assert done[0]["exit_codes"] == [[0]]  # node 0's torchrun restarted its workers itself
    assert done[1]["exit_codes"] == [[-signal.SIGKILL], [0]]  # requeued like a pod
    result = gather(run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    got = report(run_dir)
    assert got["restarts"] == 1 and got["faults"][0]["fired_step"] == 12
    # every step of both ranks, the 2 redone after the restore included (20 + 20 + 2 + 2)
    assert got["checks"]["deterministic_resume"]["detail"].startswith("all 44 steps matched")
    assert got["checks"]["atomic_recovery"]["ok"] is True


@pytest.mark.slow  # CI time: the kill above runs the same path; the merge has its unit test
def test_same_schedule_against_a_planted_bug_fails(shared: Path) -> None:
    # off_by_one acts only on resume: without faults it trains bitwise like the correct
    # target, so the module's reference serves (a run of its own would cost 10 s more)
    args = [*ARGS, "--bug", "off_by_one"]
    assert run_pair(shared, [*KILL, "--run-id", "bug"], args) == [0, 0]
    result = gather(shared / "bug")
    assert result.returncode == 1, result.stdout + result.stderr
    check = report(shared / "bug")["checks"]["deterministic_resume"]
    assert check["ok"] is False and "step 11" in check["detail"], check


def test_interrupted_node_reaps_and_gather_cannot_judge(tmp_path: Path) -> None:
    """Node 0 alone waits in the rendezvous for a peer that never comes; SIGTERM. It
    reaps its own processes only: another node 0 of a run with the same id, on the same
    machine (another job's, or another test's under pytest -n), lives on."""
    other = tmp_path / "other"
    nodes = [start_node(shared, 0, netns.free_port(), [], ARGS)
             for shared in (tmp_path, other)]
    try:
        deadline = time.monotonic() + 60
        for shared in (tmp_path, other):
            log = shared / "reference/_chaos/logs/launch-0-node-0.log"
            while not log.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        time.sleep(1.0)  # each torchrun is up, waiting for its node 1
        before = chaos_processes(other)
        nodes[0].terminate()
        _, err = nodes[0].communicate(timeout=60)
        assert nodes[0].returncode == 130, err
        assert [pid for pid in chaos_processes(tmp_path) if pid not in before] == []
        assert before and set(before) <= set(chaos_processes(other)), "the other run's node"
    finally:
        nodes[1].terminate()
        nodes[1].communicate(timeout=60)
    assert chaos_processes(tmp_path) == []
    assert multinode.finished_nodes(tmp_path / "reference")[0]["interrupted"] is True
    result = gather(tmp_path / "reference")
    assert result.returncode == 2 and "interrupted" in result.stderr, result.stderr


@pytest.mark.parametrize("options, message", [
    (["--rdzv-endpoint", "nohost"], "HOST:PORT"),
    (["--node-rank", "2"], "--node-rank must be between 0 and 1"),
    (["--fault", "partition:node=1,step=5"], "not supported across machines"),
    (["--fault", "kill:node=1,step=5"], "no finished fault-free run"),
    (["--nnodes"], "expected one argument"),
], ids=["endpoint", "node-rank", "partition", "no-reference", "missing-value"])
def test_bad_arguments_are_one_line_exit_2(tmp_path: Path, options: list[str],
                                           message: str) -> None:
    base = ["node", "--shared", str(tmp_path), "--node-rank", "0", "--nnodes", "2",
            "--rdzv-endpoint", "127.0.0.1:29400"]
    result = subprocess.run([*CLI, *base, *options, "--", *ARGS], cwd=REPO, env=environ(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_gather_of_no_run_is_one_line_exit_2(tmp_path: Path) -> None:
    result = gather(tmp_path / "nothing")
    assert result.returncode == 2 and "no run directory" in result.stderr, result.stderr
    (tmp_path / "kill/_chaos").mkdir(parents=True)
    result = gather(tmp_path)  # the shared directory, not one of its runs
    assert result.returncode == 2 and "its runs: kill" in result.stderr, result.stderr


def _node_files(run_dir: Path, node: int, boot: str, offset: float, launches: list[int],
                pids: list[int]) -> None:
    """A done marker and a harness stream, as `torchchaos node` writes them."""
    marker = multinode.marker_file(run_dir, node)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"node": node, "nnodes": 2, "interrupted": False,
                                  "clock": {"boot_id": boot, "offset": offset}}))
    log = HistoryWriter(multinode.harness_stream(run_dir, node), source="harness", node=node)
    for launch, pid in zip(launches, pids):
        log.record("workers", launch=launch, pids=[pid])
    log.close()


def test_merge_moves_each_machine_onto_node_0s_clock_and_numbers_rounds(tmp_path: Path) -> None:
    """Node 1's monotonic clock runs 1000 s behind node 0's; node 1 was requeued (its
    launch 1) while node 0's torchrun restarted (its attempt 1): one round, the second."""
    _node_files(tmp_path, 0, "boot-a", 5000.0, [0], [100])
    _node_files(tmp_path, 1, "boot-b", 6000.0, [0, 1], [200, 300])
    history = tmp_path / "_chaos/history"
    rank = {0: [(100, 0, 0, 10.0), (101, 0, 1, 20.0)],  # pid, launch, attempt, t
            1: [(200, 0, 0, 10.5 - 1000), (300, 1, 0, 20.5 - 1000)]}
    for r, processes in rank.items():
        with open(history / f"rank-{r}.jsonl", "w") as stream:
            for pid, launch, attempt, t in processes:
                stream.write(json.dumps({"ev": "boot", "t": t, "rank": r, "pid": pid,
                                         "launch": launch, "attempt": attempt}) + "\n")
    nodes = [multinode.finished_nodes(tmp_path)[k] for k in (0, 1)]
    boots = multinode.merged_history(tmp_path, nodes).of("boot")
    assert [(e["rank"], e["t"]) for e in boots] == [(0, 10.0), (1, 10.5), (0, 20.0), (1, 20.5)]
    assert [(e["launch"], e["attempt"]) for e in boots] == [(0, 0), (0, 0), (1, 1), (1, 1)]
    assert (boots[3]["node_launch"], boots[3]["node_attempt"]) == (1, 0)
