"""Publishing files so that they survive a crash or a power loss (POSIX).

Data is durable once its file is fsynced; a name (create, rename, unlink)
once its folder is fsynced. A manifest (`manifest.json`) lists the published
checkpoints, newest last. `sync=False` keeps the same steps minus every
fsync: the planted `no_fsync` bugs of the reference targets.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from typing import IO, Any


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


def read_manifest(directory: str) -> list[dict[str, Any]]:
    """The checkpoints `directory`'s manifest lists (none if it has no manifest)."""
    path = os.path.join(directory, "manifest.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["checkpoints"]


def publish_in_manifest(directory: str, entry: dict[str, Any], name_key: str, keep: int,
                        sync: bool) -> list[str]:
    """List `entry` (it has a "step") in the manifest, atomically, keeping the newest `keep`.

    Returns the names (`entry[name_key]`) the manifest no longer lists: the caller
    deletes them now, as only now nothing points at them.
    """
    old = read_manifest(directory)
    # Entries at or after this step belong to a timeline we resumed away from.
    kept = [e for e in old if e["step"] < entry["step"]]
    kept = [*kept, entry][-keep:]
    body = json.dumps({"checkpoints": kept}, indent=1).encode()
    atomic_write(directory, "manifest.json", lambda out: out.write(body), sync)
    live = {e[name_key] for e in kept}
    return [e[name_key] for e in old if e[name_key] not in live]
