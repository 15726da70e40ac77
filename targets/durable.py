"""Publishing files so that they survive a crash or a power loss (POSIX).

Data is durable once its file is fsynced; a name (create, rename, unlink)
once its folder is fsynced. `sync=False` keeps the same steps minus every
fsync: the planted `no_fsync` bugs of the reference targets.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from typing import IO


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: str, sync: bool) -> None:
    # A rename is only durable once the directory entry itself is on disk.
    if sync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_file(f: IO[bytes], write: Callable[[IO[bytes]], None], sync: bool) -> None:
    write(f)
    f.flush()
    if sync:
        os.fsync(f.fileno())


def atomic_write(directory: str, name: str, write: Callable[[IO[bytes]], None], sync: bool) -> str:
    """Write to a temp file in the same dir, then rename it over `name`."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        write_file(f, write, sync)
    final = os.path.join(directory, name)
    os.replace(tmp, final)
    fsync_dir(directory, sync)
    return final
