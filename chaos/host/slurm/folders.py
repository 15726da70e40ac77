"""Where an owned cluster lives: `slurm-<id>` in the state folder, and finding them.

Its own module so that `torchchaos.host.leftovers` can list them without importing
the cluster (which imports the lifeline, which imports leftovers)."""

from __future__ import annotations

import re
from pathlib import Path

from torchchaos.host.owners import RUN_ID, state_dir

PREFIX = "slurm-"
OURS = re.compile(rf"^{PREFIX}({RUN_ID})$")


def owned_root(cluster_id: str) -> Path:
    return state_dir() / f"{PREFIX}{cluster_id}"


def leftovers() -> list[tuple[str, str]]:
    """(folder, cluster id) of every owned cluster's folder in this state folder."""
    try:
        entries = sorted(state_dir().iterdir())
    except FileNotFoundError:
        return []
    return [(str(p), m.group(1)) for p in entries if (m := OURS.match(p.name)) and p.is_dir()]
