"""Starting one daemon of the cluster and waiting until it answers.

Every daemon runs in the foreground of a process of its own (`-D`, `-F`), in a new
session, its output in the cluster's log folder, and carries the cluster's marks in
its environment: `TORCHCHAOS_CLUSTER` (and `TORCHCHAOS_CLUSTER_NODE` for a slurmd),
inherited by every slurmstepd a slurmd starts and so by every task of a job. Those
marks, not pid files, are how the cluster finds its processes to stop them or to
fail a node; a cluster a harness owns carries the run id mark too, so the
lifeline removes it if the harness dies.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from torchchaos.errors import CannotJudge, Unavailable

INSTALL = "apt-get install -y slurm-wlm munge (and slurmdbd mariadb-server for sacct)"


def need(*programs: str) -> None:
    """Refuse (exit 2) where a program of the cluster is not installed."""
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        raise Unavailable(f"Slurm is not installed here: {', '.join(missing)} not found"
                          f" ({INSTALL})")


def start(command: list[str], log: Path, marks: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, **marks}
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=environ,
                                start_new_session=True, cwd=log.parent)


def wait_until(ready: Callable[[], bool], what: str, process: subprocess.Popen | None,
               log: Path, timeout: float) -> None:
    """Poll `ready` until it holds; fail with the log's last line where the daemon exited
    or `timeout` seconds passed."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process is not None and process.poll() is not None:
            raise CannotJudge(f"{what} exited with status {process.returncode} while"
                              f" starting: {last_line(log)}")
        if time.monotonic() > deadline:
            raise CannotJudge(f"{what} did not become ready within {timeout:.0f} s:"
                              f" {last_line(log)}")
        time.sleep(0.2)


def last_line(log: Path) -> str:
    """The last line of a daemon's log that says something, for an error message."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return f"no log at {log}"
    said = [line for line in lines if line]
    return said[-1][:300] if said else f"{log} is empty"


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def answers(command: list[str], env: dict[str, str], expect: str = "") -> bool:
    """Whether a client command exits 0 (and prints `expect`, when given)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10,
                              env={**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and expect in done.stdout
