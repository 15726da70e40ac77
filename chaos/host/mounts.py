"""Mounts a run may leave behind: every one under a run directory is a leak."""

from __future__ import annotations

from pathlib import Path


def mounts_under(path: Path) -> list[str]:
    """Mountpoints at or below `path`, from /proc/self/mountinfo."""
    prefix = str(path.resolve()).rstrip("/")
    points = [line.split()[4].replace("\\040", " ")
              for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]
