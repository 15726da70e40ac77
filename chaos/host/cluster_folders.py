"""Where an owned cluster lives (`slurm-<id>` in the state folder) and which Slurm jobs a
harness has queued (`slurm-job-<run id>.json`), and finding them.

Beside `slurm/`, not in it: `torchchaos.host.leftovers` lists them with it, and the
cluster (`slurm/cluster.py`) owns its folder on the lifeline, which sweeps leftovers, so
the whole of `slurm/` stands above the lifeline and this below."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from torchchaos.host.owners import RUN_ID, state_dir

PREFIX = "slurm-"
OURS = re.compile(rf"^{PREFIX}({RUN_ID})$")


def owned_root(cluster_id: str) -> Path:
    return state_dir() / f"{PREFIX}{cluster_id}"


def leftovers() -> list[tuple[str, str]]:
    """(folder, cluster id) of every owned cluster's folder in this state folder."""
    return [(str(p), run) for p, run in _named(OURS) if p.is_dir()]


def _named(pattern: re.Pattern[str]) -> list[tuple[Path, str]]:
    """(entry, its id) of every entry of the state folder whose name `pattern` matches."""
    try:
        entries = sorted(state_dir().iterdir())
    except FileNotFoundError:
        return []
    return [(p, m.group(1)) for p in entries if (m := pattern.match(p.name))]


# -- jobs a harness submitted: cancelled if it dies before they end -------------

JOB_PREFIX = "slurm-job-"
JOB_FILE = re.compile(rf"^{JOB_PREFIX}({RUN_ID})\.json$")


def job_file(run_id: str) -> Path:
    """Where a harness notes the Slurm job of its run `run_id` while the job may still
    be queued or running: the lifeline's watcher cancels what such a note names."""
    return state_dir() / f"{JOB_PREFIX}{run_id}.json"


def note_job(run_id: str, job: int, slurm_conf: str) -> None:
    path = job_file(run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"job": job, "slurm_conf": slurm_conf}))


def job_leftovers() -> list[tuple[str, str]]:
    """(note, run id) of every job note in this state folder."""
    return [(str(p), run) for p, run in _named(JOB_FILE)]


def cancel_noted(note: str) -> list[str]:
    """Cancel the job a note names and remove the note; what failed, in words."""
    path = Path(note)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return []
    environ = {**os.environ, **({"SLURM_CONF": data["slurm_conf"]} if data["slurm_conf"] else {})}
    try:
        done = subprocess.run(["scancel", str(data["job"])], capture_output=True, text=True,
                              timeout=20, env=environ)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"slurm job {data['job']}: scancel failed ({exc})"]
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        return [f"slurm job {data['job']}: {done.stderr.strip() or 'scancel failed'}"]
    path.unlink(missing_ok=True)
    return []
