"""What a finished run wrote, recorded once and checked on every reuse.

The harness keeps runs to reuse (the reference run, the recording of a save) in a cache
a user may copy, sync or damage. A tool that judges checkpoint atomicity writes its own
cache the way it tells users to write checkpoints: it records the size and digest of
every file a run's `_chaos/` holds, makes them durable, and names them in a marker
published last and atomically (`torchchaos.rundir.folders.write_atomic`). On reuse the files
are compared with the marker; whatever differs is named, and the run is made again,
never judged against.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from torchchaos.rundir.folders import fsync_dir
from torchchaos.rundir.layout import RunLayout

# Files bigger than this (a large model's weights, a recording's bytes) are compared by
# size, not read whole on every reuse.
DIGESTED_BYTES = 64 << 20
# Folders of a run's _chaos/ whose files no judgment reads: scratch (TMPDIR: torchrun's
# sockets), stacks and beats (written by the runner, not the run's record)
UNCHECKED = ("tmp", "stacks", "beats")


def written_files(entry: Path, runs: list[Path], sync: bool = False) -> dict[str, list]:
    """Every regular file of the runs' `_chaos/` (runs inside `entry`): its size and
    digest, by its path in `entry`. `sync`: made durable too, before a marker names them."""
    found: dict[str, list] = {}
    for run in runs:
        chaos_dir = RunLayout(run).chaos_dir
        for folder, dirs, files in os.walk(chaos_dir):
            if Path(folder) == chaos_dir:
                dirs[:] = [d for d in dirs if d not in UNCHECKED]
            dirs.sort()  # the same order every time: the first difference is the one said
            for name in sorted(files):
                path = Path(folder, name)
                if stat.S_ISREG(path.lstat().st_mode):  # never open a socket or a FIFO
                    found[str(path.relative_to(entry))] = _size_and_digest(path, sync)
            if sync:
                fsync_dir(Path(folder))
    return found


def _size_and_digest(path: Path, sync: bool) -> list:
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        digest = None
        if size <= DIGESTED_BYTES:  # hashlib.file_digest is 3.11+
            digest = hashlib.sha256(handle.read()).hexdigest()
        if sync:
            os.fsync(handle.fileno())
    return [size, digest]


def files_differ(entry: Path, runs: list[Path], recorded: dict[str, list],
                 marker: Path) -> str:
    """What of the runs' files differs from what `marker` recorded, or ""."""
    try:
        now = written_files(entry, runs)
    except OSError as exc:
        return f"{exc.filename}: {exc.strerror or exc}"
    for name, was in recorded.items():
        if not (isinstance(was, list) and len(was) == 2):
            return f"{marker} records {name} as {was!r}, not [size, digest]"
        if name not in now:
            return f"{entry / name} is missing"
        if now[name][0] != was[0]:
            return f"{entry / name} holds {now[name][0]} bytes, {was[0]} when it was written"
        if now[name] != was:
            return f"{entry / name} changed since it was written (its digest differs)"
    added = sorted(set(now) - set(recorded))
    return f"{entry / added[0]} was not there when the entry was written" if added else ""


def holds_bytes(path: Path, text: str, chunk: int = 8 << 20) -> bool:
    """Whether the file holds `text` (read a chunk at a time: checkpoints are GB)."""
    needle, tail = text.encode(), b""
    with open(path, "rb") as f:
        while block := f.read(chunk):
            if needle in tail + block:
                return True
            tail = block[-len(needle):]
    return False
