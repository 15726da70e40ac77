"""A short name for a run's temporary folder, where its own path is too long.

Ranks get `TMPDIR` inside their run directory (`_chaos/tmp`), so what torch and
torchrun leave there goes with the run. But a Unix socket's path may be at most
107 bytes, and Python's multiprocessing makes its sockets under `TMPDIR`
(`pymp-XXXXXXXX/listener-XXXXXXXX`: a DataLoader worker hands each batch's
shared memory over one). Under a deep run directory (pytest's temporary
folders, the reference cache) every such socket fails with "AF_UNIX path too
long" and the workers' batches never arrive: the job hangs. Such a run gets a
symbolic link `tmp-<run id>` in the harness's state folder that points at its
temporary folder, and `TMPDIR` names the link: short, while the files stay in
the run. The link goes when the job ends, or with the lifeline's sweep once its
harness is gone (`leftovers`).

A folder a process lends its launcher server's socket in (`harness.spare.share`)
gets the same where it lies too deep (a cluster job's `TMPDIR`): a link
`lend-<pid>` to it, removed when that process exits, or by the sweep once it is
dead.
"""

from __future__ import annotations

import atexit
import os
import re
from pathlib import Path

import psutil

from torchchaos.host.owners import RUN_ID, state_dir

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its terminating NUL
# the longest name Python puts under TMPDIR for a socket, with room to spare:
# "/pymp-" + 8 + "/listener-" + 8 characters
LONGEST_SOCKET_NAME = 40
PREFIX = "tmp-"
# a run's id, or a node harness's of a job across machines: <the job's run id>-node-K-<8
# hex>, where the job's may be anything a user or a scheduler named it ("slurm-...")
OURS = re.compile(rf"^{PREFIX}({RUN_ID}|[\w.-]+-node-\d+-[0-9a-f]{{8}})$")
LEND = "lend-"
LENT = re.compile(rf"^{LEND}(\d+)$")


def short_tmp(tmp_dir: Path, run_id: str) -> Path:
    """`tmp_dir` where sockets fit under it; else the run's link to it (made now)."""
    if len(str(tmp_dir)) + LONGEST_SOCKET_NAME <= SOCKET_PATH_MAX:
        return tmp_dir
    return _pointed(state_dir() / f"{PREFIX}{run_id}", tmp_dir)


def short_folder(folder: Path, room: int, limit: int = SOCKET_PATH_MAX) -> Path:
    """`folder` where `room` more bytes keep a path under it within `limit`; else this
    process's link to it (made now, removed when the process exits)."""
    if len(str(folder).encode()) + room <= limit:
        return folder
    link = _pointed(state_dir() / f"{LEND}{os.getpid()}", folder)
    atexit.register(link.unlink, missing_ok=True)
    return link


def _pointed(link: Path, folder: Path) -> Path:
    """`link`, made (where it points elsewhere or nowhere) to point at `folder`."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if not (link.is_symlink() and Path(link.readlink()) == folder):
        link.unlink(missing_ok=True)
        link.symlink_to(folder, target_is_directory=True)
    return link


def release(run_id: str) -> None:
    """Remove the run's link, if it has one."""
    (state_dir() / f"{PREFIX}{run_id}").unlink(missing_ok=True)


def leftovers() -> list[tuple[str, str]]:
    """(link, run id) of every run's link in this state folder."""
    try:
        entries = sorted(state_dir().iterdir())
    except FileNotFoundError:
        return []
    runs = [(str(p), m.group(1)) for p in entries
            if (m := OURS.match(p.name)) and p.is_symlink()]
    lent = [(str(p), "") for p in entries if (m := LENT.match(p.name)) and p.is_symlink()
            and not psutil.pid_exists(int(m.group(1)))]  # a live lender's is no leftover
    return runs + lent
