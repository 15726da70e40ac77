"""A job that sees its run directory at another path: where a recording ran.

Many training scripts store where they write in their checkpoints (nanoGPT keeps its
config, `out_dir` included, in every checkpoint; Lightning keeps its `dirpath`), and some
read it back. A crash state's recovery runs in a folder of its own, so a checkpoint
copied there from the recording names the recording's folder, not the recovery's.

So the recovery's processes get a mount namespace of their own, in which its run
directory is bind-mounted over the recording's path and the job starts in it: every
path the recording wrote resolves to the recovery's own files, exactly as the job
would have seen them had it resumed where it ran. Nothing outside the job sees the
mount (the namespace's propagation is private), and it ends with the job's last
process, so there is nothing to heal. The recording's own folder is never written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# unshare execs the shell (no fork for a mount namespace), and the shell execs the
# launcher: the pid the harness started stays the job's, for signals and reaping.
_ENTER = 'mount --rbind -- "$1" "$2" && cd -- "$2" && shift 2 && exec "$@"'


def unavailable_reason() -> str | None:
    """Why a job cannot be given a mount namespace here, or None."""
    if os.geteuid() != 0:
        return "a mount namespace needs root"
    missing = [tool for tool in ("unshare", "mount") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (util-linux)"
    return None


def command(run_dir: Path, seen_at: Path, launch: list[str]) -> list[str]:
    """`launch`, run with `run_dir` mounted over `seen_at` and as its working folder, in
    a mount namespace of its own."""
    return ["unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", _ENTER, "torchchaos-seen-at", str(run_dir), str(seen_at), *launch]
