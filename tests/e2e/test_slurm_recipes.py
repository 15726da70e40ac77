"""deploy/slurm/ run for real on a Slurm cluster on this machine: the cron line, run with
cron's bare environment, submits the nightly's array of campaign shards and its merge
after a dependency; the merged verdicts equal one machine's campaign, and the exit
status Slurm shows is the night's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from torchchaos.host.slurm import jobs
from torchchaos.host.slurm.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "deploy" / "slurm"
RUNS = 4


def _environment_folder(folder: Path) -> Path:
    """What `python -m venv` gives a job, as far as the recipes use it: bin/activate puts
    the folder of this interpreter (and its torchchaos command) on PATH."""
    venv = folder / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(
        f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    return venv


def _settings(folder: Path, venv: Path | None = None,
              fail_on: str = "silent divergence,hang") -> Path:
    path = folder / "nightly.env"
    path.write_text("\n".join([
        f'TORCHCHAOS_VENV="{venv or ""}"',
        f'RUNS_ROOT="{folder / "runs"}"', 'PARTITION=""', "TASKS=2", f"RUNS={RUNS}",
        "CPUS_PER_TASK=1", "MEM=1G", "TIME=00:15:00", "MERGE_TIME=00:05:00",
        f'FAIL_ON="{fail_on}"', "CAMPAIGN_ARGS=()"]) + "\n")
    return path


def _cron_line(settings: Path, home: Path) -> str:
    """deploy/slurm/nightly.crontab's line, this checkout's paths in it: its command."""
    (line,) = [x for x in (RECIPES / "nightly.crontab").read_text().splitlines()
               if x and not x.startswith("#")]
    command = line.split(None, 5)[5]  # after minute, hour, day, month, weekday
    return (command.replace("$HOME/nightly.env", str(settings))
            .replace("$HOME/torchchaos/", f"{REPO}/"))


def _as_cron_runs(command: str, cluster: Cluster, home: Path) -> subprocess.CompletedProcess:
    """The command as cron runs it: /bin/sh, HOME, and PATH=/usr/bin:/bin, nothing else
    (SLURM_CONF aside: a site's sbatch finds /etc/slurm/slurm.conf without it)."""
    bare = {"HOME": str(home), "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh",
            "LOGNAME": "root", **cluster.env()}
    return subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                          env=bare, timeout=60)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchchaos.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_the_nightly_array_and_its_merge_give_one_machines_verdicts_and_fail_the_job(
        tmp_path: Path, shared_cache: Path) -> None:
    settings = _settings(tmp_path, _environment_folder(tmp_path))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "cache").symlink_to(shared_cache)  # the session's reference runs
    with Cluster.start(nodes=2) as cluster:
        submitted = _as_cron_runs(_cron_line(settings, tmp_path), cluster, tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        said = (tmp_path / "torchchaos-nightly.log").read_text()
        array, merge = map(int, re.findall(r"job (\d+)", said))
        assert jobs.show(merge, cluster.env())["Dependency"].startswith(f"afterany:{array}_*")
        jobs.wait_ended(merge, 600, cluster.env(), poll=2)
        tasks = jobs.states(array, cluster.env())
        record = jobs.show(merge, cluster.env())
    root = tmp_path / "runs" / f"campaign-{array}"
    log = (tmp_path / "runs" / f"torchchaos-merge-{merge}.log").read_text()
    assert tasks == ["COMPLETED", "COMPLETED"], log
    # the bundled target without its defences: flips diverge silently, and the night is red
    assert (record["JobState"], record["ExitCode"]) == ("FAILED", "1:0"), log
    assert sorted(p.name for p in root.glob("shard-*")) == ["shard-0", "shard-1"]
    whole = _cli("campaign", "--quiet", "--runs", str(RUNS), "--cache-dir", str(shared_cache),
                 "--out", str(tmp_path / "whole"), cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    assert json.loads((root / "merged" / "campaign.json").read_text()) == json.loads(
        (tmp_path / "whole" / "campaign.json").read_text())
    # the same shards, measured without a bar to fail: exit 0 (the campaign's own meaning)
    again = _cli("merge", *map(str, sorted(root.glob("shard-*"))), "--out",
                 str(tmp_path / "again"), "--fail-on", "hang", cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def test_a_job_without_torchchaos_on_its_path_says_so_and_exits_2(tmp_path: Path) -> None:
    """No TORCHCHAOS_VENV, and cron's PATH: every job says what to set, exit 2."""
    settings = _settings(tmp_path)
    with Cluster.start(nodes=1) as cluster:
        submitted = _as_cron_runs(_cron_line(settings, tmp_path), cluster, tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        said = (tmp_path / "torchchaos-nightly.log").read_text()
        array, merge = map(int, re.findall(r"job (\d+)", said))
        jobs.wait_ended(merge, 120, cluster.env())
        record = jobs.show(merge, cluster.env())
    assert record["ExitCode"] == "2:0"
    log = (tmp_path / "runs" / f"torchchaos-merge-{merge}.log").read_text()
    assert log.strip().splitlines() == [
        f"torchchaos: error: torchchaos is not on this node's PATH (set TORCHCHAOS_VENV in"
        f" {settings} to the environment it is installed in)"]
