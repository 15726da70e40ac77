"""The Slurm cluster on this machine: real munge, slurmctld, slurmd and slurmdbd.

Each check runs what a site's Slurm does (a step on every node, a node failure answered
with a requeue, a time limit, accounting), and each ends with nothing of the cluster
left: no process, no folder, no port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from torchchaos.errors import UsageError
from torchchaos.host import procs
from torchchaos.host.slurm import daemons, jobs
from torchchaos.host.slurm.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]

# one cluster for the module: its tests on one worker (`--dist loadgroup`)
pytestmark = pytest.mark.xdist_group("slurm-cluster")


@pytest.fixture(scope="module")
def cluster():
    """Three nodes: a requeued job runs on the two left when one fails, as on a site. (A
    node brought back at once, with its old job still completing in slurmctld's eyes,
    would take the requeued job and leave its steps pending: seen here, Slurm 22.05.)"""
    with Cluster.start(nodes=3, accounting_too=True) as running:
        yield running


def _run(command: list[str], cluster: Cluster, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **cluster.env()}, **kwargs)


def _accounted(cluster: Cluster, options: list[str], expect: str, timeout: float = 30) -> str:
    """sacct's answer once it holds `expect`: slurmctld sends records to slurmdbd a few
    seconds after the fact."""
    deadline = time.monotonic() + timeout
    while True:
        said = _run(["sacct", "-n", "-P", *options], cluster).stdout
        if expect in said or time.monotonic() > deadline:
            return said
        time.sleep(0.5)


def _written(path: Path, expect: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if expect in text or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def test_a_step_runs_on_every_node_and_sacct_records_it(cluster: Cluster) -> None:
    done = _run(["srun", "-N2", "-l", "printenv", "SLURMD_NODENAME"], cluster)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["0:", "1:", "n1", "n2"]  # the first two of three
    listed = _accounted(cluster, ["-X", "-o", "JobName,State"], "printenv|COMPLETED")
    assert "printenv|COMPLETED" in listed.splitlines(), listed


def test_a_node_failure_requeues_the_job_and_its_output_goes_on(cluster: Cluster,
                                                                 tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho \"attempt ${SLURM_RESTART_COUNT:-0}\"\n"
                      "srun -N2 bash -c 'echo \"task on $SLURMD_NODENAME\"; sleep 300'\n")
    out = tmp_path / "slurm-%j.out"
    job = jobs.submit(str(script), ["-N2", "--requeue", "--open-mode=append", f"-o{out}"],
                      cluster.env())
    written = Path(str(out).replace("%j", str(job)))
    assert _written(written, "task on n2").count("task on") == 2
    killed = cluster.fail_node("n2")
    assert len(killed) >= 3  # slurmd, the step's slurmstepd, its task
    assert not cluster.node_pids("n2")
    record = jobs.wait_for(job, lambda r: r.get("Restarts") == "1", 60, cluster.env(),
                           "its requeue")
    assert record["Requeue"] == "1"
    jobs.release(job, 60, cluster.env())
    running = jobs.wait_for(job, lambda r: r["JobState"] == "RUNNING", 60, cluster.env())
    assert running["NodeList"] == "n[1,3]"
    text = _written(written, "task on n3")
    again = text.split("attempt 1\n", 1)[1]
    assert text.startswith("attempt 0\n") and sorted(again.split("\n")[:2]) == [
        "task on n1", "task on n3"], text
    failed = _accounted(cluster, ["-D", "-X", "-j", str(job), "-o", "State"], "NODE_FAIL")
    assert failed.split()[0] == "NODE_FAIL", failed
    jobs.cancel(job, cluster.env())
    jobs.wait_ended(job, 30, cluster.env())
    cluster.restart_node("n2")
    jobs.wait_for(job, lambda r: True, 5, cluster.env())
    deadline = time.monotonic() + 30
    while not cluster.idle() and time.monotonic() < deadline:
        time.sleep(0.5)


def test_a_time_limit_signals_ahead_then_ends_the_job(cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "limited.sh"
    script.write_text("#!/bin/bash\ntrap 'echo got USR1' USR1\n"
                      "for i in $(seq 1 3000); do sleep 0.1; done\n")
    out = tmp_path / "limited.out"
    job = jobs.submit(str(script), ["--time=1", "--signal=B:USR1@50", f"-o{out}"],
                      cluster.env())
    # the limit is a minute: USR1 comes 50 s before it, once slurmctld's check runs
    states = jobs.wait_ended(job, 150, cluster.env())
    assert states == ["TIMEOUT"]
    text = _written(out, "DUE TO TIME LIMIT")  # slurmstepd's line, written as the job ends
    assert "got USR1" in text and "*** JOB" in text, text


def test_a_refused_job_is_a_usage_error_before_anything_is_queued(cluster: Cluster,
                                                                   tmp_path: Path) -> None:
    script = tmp_path / "big.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    with pytest.raises(UsageError, match="Requested node configuration is not available"):
        jobs.submit(str(script), ["--mem=100000G"], cluster.env())
    with pytest.raises(UsageError, match="Invalid partition name"):
        jobs.submit(str(script), ["--partition=nosuch"], cluster.env())
    queued = _run(["squeue", "-h", "-n", "big.sh"], cluster)
    assert queued.stdout.strip() == ""


def test_a_stopped_cluster_leaves_no_process_folder_or_port() -> None:
    cluster = Cluster.start(nodes=1)
    ports = [cluster.layout.ports.controller, *cluster.layout.ports.nodes]
    assert all(daemons.listening(p) for p in ports)
    sleeper = subprocess.Popen(["srun", "sleep", "300"], env={**os.environ, **cluster.env()},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while len(cluster.node_pids("n1")) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    on_node = cluster.node_pids("n1")
    assert cluster.stop() == []
    sleeper.kill()  # the client, not the cluster's: srun retries a controller that is gone
    sleeper.wait(timeout=30)
    assert not any(procs.pid_alive(p) for p in on_node)
    assert not cluster.layout.root.exists()
    assert not any(daemons.listening(p) for p in ports)


def test_a_killed_harness_leaves_no_cluster(tmp_path: Path) -> None:
    """The harness owns its cluster through its lifeline: SIGKILL it while a job runs on
    both nodes, and the watcher kills every daemon, every slurmstepd (they clear their
    environment, so no mark finds them) and the job's tasks; the sweep removes the
    folder."""
    starter = tmp_path / "starter.py"
    starter.write_text(textwrap.dedent("""
        import os, subprocess, time
        from torchchaos.host.slurm.cluster import Cluster
        cluster = Cluster.start(nodes=2)
        subprocess.run(["sbatch", "-N2", "-o/dev/null", "--wrap=srun sleep 300"],
                       env={**os.environ, **cluster.env()}, check=True, capture_output=True)
        while len(cluster.node_pids("n2")) < 3:  # slurmd, the step, its task
            time.sleep(0.2)
        print(cluster.cluster_id, cluster.layout.root, flush=True)
        time.sleep(600)
    """))
    harness = subprocess.Popen([sys.executable, str(starter)], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        cluster_id, root = harness.stdout.readline().split()
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
    from torchchaos import env

    def left() -> list[str]:
        """Daemons by their mark, the job's tasks by the SLURM_CONF they were given, the
        slurmstepds (no environment) by the node logs they hold open."""
        conf = str(Path(root) / "slurm.conf")
        found = {pid for pid, value in procs.env_values((env.CLUSTER,)).items()
                 if value == cluster_id}
        found |= {pid for pid, value in procs.env_values(("SLURM_CONF",)).items()
                  if value == conf}
        found |= set(_holding_under(Path(root)))
        return sorted(f"{pid} {_command_of(pid)}" for pid in found)

    from torchchaos.host import lifeline

    # The watcher may still be in a later round (it holds the lock, so a sweep leaves
    # its runs alone meanwhile): what is asserted is that nothing is left in the end.
    deadline = time.monotonic() + 30
    while (left() or Path(root).exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
        lifeline.sweep_stale(lambda _: None)
    assert left() == []
    assert not Path(root).exists()


def _command_of(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def _holding_under(root: Path) -> list[int]:
    """Processes with a descriptor on a file under `root` (deleted or not)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if any(f.path.startswith(str(root)) for f in proc.open_files()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_the_command_line_refuses_a_machine_without_slurm(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    done = subprocess.run([str(bare / "python"), "-m", "torchchaos.cli", "cluster", "up",
                           "--dir", str(tmp_path / "c")], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(bare)}, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert "Slurm is not installed here: munged" in done.stderr and "apt-get" in done.stderr
    assert not (tmp_path / "c").exists()


def test_a_controller_that_is_down_is_one_clear_error_and_nothing_queued(tmp_path: Path) -> None:
    """slurmctld killed: sbatch's own words, as a UsageError (exit 2 on the command line),
    within sbatch's retries (9 s here), never a hang."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    with Cluster.start(nodes=1) as cluster:
        (controller,) = [p for p in cluster.processes if "slurmctld" in p.args[0]]
        controller.kill()
        controller.wait()
        started = time.monotonic()
        with pytest.raises(UsageError, match="Unable to contact slurm controller"):
            jobs.submit(str(script), [], cluster.env())
        assert time.monotonic() - started < 30
