"""The folders the harness writes in (an --out, the reference cache): whether they can be
written before anything is, and files published whole.

A folder that cannot be written is found by trying: permissions, a read-only mount, a full
disk and a file where a folder should be all show only when a file is made in it, so a
probe is made and removed in the folder (or the nearest one above it that exists).
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

PROBE_BYTES = 4096  # a block: on a full filesystem the write, not the create, fails
# Less free space than this and even a fault-free run of a tiny job cannot finish (the
# bundled target's reference run takes about 1 MiB).
MIN_FREE_BYTES = 1 << 20


def unwritable(folder: Path) -> str:
    """Why files cannot be made in `folder` (made first where missing), or "" when they
    can. Writes nothing that outlives the call."""
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    why = _probe(existing)
    if why:
        return why
    stat = os.statvfs(existing)
    free = stat.f_bavail * stat.f_frsize
    if free < MIN_FREE_BYTES:
        return f"{existing} is full ({free // 1024} KiB free)"
    return ""


def _nearest_existing(folder: Path) -> Path:
    path = folder.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(folder: Path) -> str:
    """Make, fill, sync and remove a small file in `folder`: "" when all of it worked."""
    probe = folder / f".torchchaos-probe-{uuid.uuid4().hex}"  # threads of a harness too
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return _said(folder, exc)
    try:
        os.write(fd, b"\0" * PROBE_BYTES)
        os.fsync(fd)
    except OSError as exc:
        return _said(folder, exc)
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return ""


def _said(folder: Path, exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return f"{folder} is full (no space left on its filesystem)"
    return f"cannot write in {folder} ({exc.strerror or exc})"


def write_atomic(path: Path, text: str) -> None:
    """Publish `path` whole or not at all, and durably: a temporary file in the same
    folder, synced, renamed over it, and the folder synced (a crash leaves the old file or
    the new one, never a part)."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "x") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make the folder's entries (files made or renamed in it) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
