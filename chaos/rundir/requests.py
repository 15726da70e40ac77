"""A rank asks the harness to apply a harness fault (`torchchaos.faults.contract.HarnessKind`).

The rank writes `_chaos/requests/<fault id>.json` and waits for `<fault id>.done`,
which the harness's nemesis (`torchchaos.harness.nemesis`) writes once the fault is in
force: "at step N" then means before step N + 1 begins.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from torchchaos.rundir.layout import RunLayout

ACK_TIMEOUT = 30.0  # seconds a rank waits for the harness to apply its request
POLL_SECONDS = 0.05


def request(run_dir: str, fault_id: str, step: int | None) -> bool:
    """In a rank: ask the harness to apply a fault now; True once it did."""
    layout = RunLayout(Path(run_dir))
    layout.requests_dir.mkdir(parents=True, exist_ok=True)
    tmp = layout.requests_dir / f".{fault_id}.tmp"
    tmp.write_text(json.dumps({"id": fault_id, "step": step, "pid": os.getpid()}))
    os.replace(tmp, layout.requests_dir / f"{fault_id}.json")
    done = layout.requests_dir / f"{fault_id}.done"
    deadline = time.monotonic() + ACK_TIMEOUT
    while time.monotonic() < deadline:
        if done.exists():
            return True
        time.sleep(POLL_SECONDS)
    return done.exists()  # this rank may have been frozen past the deadline by the fault
