"""Chaos under the scheduler: `torchchaos cluster run` submits the training job to a real
Slurm cluster on this machine, Slurm's own failures hit it (a node's failure, a time
limit announced by its signal, a preemption), Slurm requeues it, and the same checks
judge the recovery: the bundled target and a script written the way a lab writes one
for Slurm (`bench/targets/slurm_train.py`: srun-style ranks, save and requeue itself on
SIGUSR1), each planted bug caught and its correct variant passing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchchaos.host.slurm.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
BUNDLED = [str(REPO / "targets" / "ddp_lm.py"), "--steps", "300", "--ckpt-every", "5"]
LAB = [str(REPO / "bench" / "targets" / "slurm_train.py"), "--steps", "60",
       "--ckpt-every", "5", "--ckpt-dir", "{run_dir}/ckpt", "--step-sleep", "0.1"]

pytestmark = pytest.mark.xdist_group("slurm-chaos")


@pytest.fixture(scope="module")
def cluster():
    """Three nodes: a two-node job that loses one is requeued onto the other two."""
    with Cluster.start(nodes=3) as running:
        yield running


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One shared directory: runs of the same job share its fault-free reference."""
    return tmp_path_factory.mktemp("shared")


def _cluster_run(cluster: Cluster, shared: Path, fault: str | None, target: list[str],
                 *more: str) -> tuple[int, dict, str]:
    command = [sys.executable, "-m", "torchchaos.cli", "cluster", "run", "--dir",
               str(cluster.layout.root), "--shared", str(shared), "--timeout", "120",
               *([f"--fault={fault}"] if fault else []), *more, "--", *target]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    said = done.stdout + done.stderr
    runs = [p for p in shared.glob("slurm-*/report.json")]
    newest = max(runs, key=lambda p: p.stat().st_mtime) if runs else None
    report = json.loads(newest.read_text()) if newest and fault else {}
    return done.returncode, report, said


def _verdicts(report: dict) -> dict[str, str]:
    words = {True: "pass", False: "fail", None: "skip"}
    return {name: words[check["ok"]] for name, check in report["checks"].items()}


def _nothing_queued(cluster: Cluster) -> bool:
    done = subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **cluster.env()})
    return done.stdout.strip() == ""


def test_a_node_failure_is_requeued_by_slurm_and_the_bundled_target_resumes_bitwise(
        cluster: Cluster, shared: Path) -> None:
    code, report, said = _cluster_run(cluster, shared, "slurm:event=node_fail,node=1,step=12",
                                      BUNDLED)
    assert code == 0, said
    assert "Slurm requeued job" in said and "node n2 failed" in said, said
    verdicts = _verdicts(report)
    for check in ("completes", "atomic_recovery", "deterministic_resume", "bounded_lost_work",
                  "no_orphans"):
        assert verdicts[check] == "pass", (check, said)
    assert report["faults"][0]["fired"] and report["restarts"] == 1
    assert cluster.idle() or _wait_idle(cluster), cluster.node_states()  # n2 came back
    assert _nothing_queued(cluster)


def test_without_faults_the_fault_free_job_is_judged(cluster: Cluster, shared: Path) -> None:
    """The reference of the job: run once per shared directory, then judged again from
    what it left (it completes and leaves nothing)."""
    for _ in range(2):
        code, _, said = _cluster_run(cluster, shared, None, BUNDLED)
        assert code == 0 and "verdict: PASS" in said, said
    assert "already ran" in said


def test_a_preemption_is_requeued_and_the_bundled_target_resumes_bitwise(
        cluster: Cluster, shared: Path) -> None:
    code, report, said = _cluster_run(cluster, shared, "slurm:event=preempt,step=12", BUNDLED)
    assert code == 0, said
    assert "of partition urgent took the job's nodes" in said, said
    assert _verdicts(report)["deterministic_resume"] == "pass"
    assert report["restarts"] == 1
    assert _nothing_queued(cluster)


LIMIT = "slurm:event=time_limit,step=12,lead=3"


def test_the_bundled_target_has_no_answer_to_a_time_limit_and_the_verdict_says_why(
        cluster: Cluster, shared: Path) -> None:
    """It installs no handler for the warning (ignored, as torchchaos node leaves it),
    so the limit ends it mid-way and Slurm requeues no job that ran out of time."""
    code, report, said = _cluster_run(cluster, shared, LIMIT, BUNDLED)
    assert code == 1, said
    assert _verdicts(report)["completes"] == "fail" and report["restarts"] == 0
    assert "Slurm requeues no job that ran out of time" in report["checks"]["completes"][
        "detail"], said


@pytest.mark.parametrize(("fault", "variant", "verdict", "failing"), [
    (LIMIT, [], 0, None),  # saves on the signal, requeues itself, resumes: nothing lost
    (LIMIT, ["--on-usr1", "ignore"], 1, "completes"),  # the limit ends it, unrequeued
    (LIMIT, ["--no-resume"], 1, "bounded_lost_work"),  # requeued, starts again from step 0
    # the nodes lose power once the job left them (the maintenance the limit was for):
    (LIMIT + ",power=lost", [], 0, None),  # its save was fsynced, file and folder
    (LIMIT + ",power=lost", ["--no-fsync"], 1, "durable_checkpoints"),  # it was not
])
def test_a_time_limit_signal_judges_the_lab_script_and_its_planted_bugs(
        cluster: Cluster, shared: Path, fault: str, variant: list[str], verdict: int,
        failing: str | None) -> None:
    code, report, said = _cluster_run(cluster, shared, fault, LAB + variant)
    assert code == verdict, said
    verdicts = _verdicts(report)
    if failing is None:
        assert set(verdicts.values()) <= {"pass", "skip"}, verdicts
        assert verdicts["bounded_lost_work"] == "pass" and report["restarts"] == 1
        assert verdicts["durable_checkpoints"] == ("pass" if "power" in fault else "skip")
    else:
        assert verdicts[failing] == "fail", (verdicts, said)
        assert f"cause: {failing}:" in said, said
    assert _nothing_queued(cluster)


@pytest.mark.parametrize("fault", ["slurm:event=node_fail,node=0,step=12",
                                   "slurm:event=preempt,step=12"])
def test_the_lab_script_resumes_bitwise_after_a_node_failure_or_a_preemption(
        cluster: Cluster, shared: Path, fault: str) -> None:
    """No signal to answer: its ranks die (SIGKILL with the node, SIGTERM, KillWait and
    SIGKILL in a preemption), Slurm requeues the job, and it resumes from its newest
    checkpoint."""
    code, report, said = _cluster_run(cluster, shared, fault, LAB)
    assert code == 0, said
    verdicts = _verdicts(report)
    assert verdicts["deterministic_resume"] == verdicts["bounded_lost_work"] == "pass", said
    assert report["restarts"] == 1
    assert _nothing_queued(cluster)


def test_a_job_that_never_starts_is_cancelled_within_the_wait(cluster: Cluster,
                                                              shared: Path) -> None:
    command = [sys.executable, "-m", "torchchaos.cli", "cluster", "run", "--dir",
               str(cluster.layout.root), "--shared", str(shared / "never"), "--queue-wait",
               "5", "--sbatch=--begin=now+1hour", "--", *LAB, "--steps", "7"]
    (shared / "never").mkdir()
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "did not start within 5 s" in done.stderr, done.stderr
    assert time.monotonic() - started < 60
    assert _nothing_queued(cluster)


def test_a_slurm_fault_counts_as_fired_only_once_slurm_acted(cluster: Cluster,
                                                              shared: Path) -> None:
    """A preemption asked for at the job's last step races the job's end: where Slurm
    requeued the job first it fired (and the job resumed), where the job ended first it
    tested nothing, and the run says so (exit 2) instead of passing."""
    code, report, said = _cluster_run(cluster, shared, "slurm:event=preempt,step=20",
                                      [*BUNDLED[:2], "20", *BUNDLED[3:]])
    fired = report["faults"][0]["fired"]
    assert fired == (report["restarts"] == 1), said
    if fired:
        assert code == 0 and _verdicts(report)["deterministic_resume"] == "pass", said
    else:
        assert code == 2 and "the job ended before the scheduler preempted it" in said, said


def test_a_killed_harness_cancels_its_job(cluster: Cluster, shared: Path) -> None:
    command = [sys.executable, "-m", "torchchaos.cli", "cluster", "run", "--dir",
               str(cluster.layout.root), "--shared", str(shared / "killed"), "--", *LAB,
               "--steps", "2000"]
    (shared / "killed").mkdir()
    harness = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _nothing_queued(cluster):
        time.sleep(0.5)
    assert not _nothing_queued(cluster), "the job was never queued"
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _nothing_queued(cluster):
        time.sleep(0.5)
    assert _nothing_queued(cluster), "the dead harness's job is still queued or running"
    assert _wait_idle(cluster)


def test_bad_input_is_one_line_and_exit_2_before_anything_is_queued(
        cluster: Cluster, shared: Path, tmp_path: Path) -> None:
    cases = [
        (["--site", "--fault=slurm:event=node_fail,node=1,step=3"], "only on a cluster torch"),
        (["--fault=slurm:event=reboot,step=3"], "reboot"),
        (["--fault=slurm:event=node_fail,step=3,lead=4"], "lead= and signal= belong"),
        (["--sbatch=--partition=nowhere", "--fault=slurm:event=preempt,step=3"],
         "the cluster refused the job"),
    ]
    before = set(shared.iterdir())
    for more, words in cases:
        command = [sys.executable, "-m", "torchchaos.cli", "cluster", "run", "--dir",
                   str(cluster.layout.root), "--shared", str(shared), *more, "--", *BUNDLED]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              env={**os.environ, **cluster.env()})
        assert done.returncode == 2 and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = subprocess.run([sys.executable, "-m", "torchchaos.cli", "cluster", "run", "--dir",
                           str(tmp_path), "--shared", str(shared), "--", *BUNDLED],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no cluster in" in done.stderr, done.stderr
    assert _nothing_queued(cluster)
    assert set(shared.iterdir()) == before  # a refused job leaves no run behind


def _wait_idle(cluster: Cluster, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.idle():
            return True
        time.sleep(0.5)
    return False
