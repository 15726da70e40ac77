"""Crash states at a size real jobs save (-m slow): the harness's memory stays flat.

The bundled target with 300 MB of state per rank (`--state-mb 300`, each rank its own
file): every crash state of save 2 judged from one recording, the harness's resident
memory sampled all along. Before states were extents of the recording, this size could
not run at all (the states' private copies of the folder needed terabytes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO

from torchchaos.faults.faultfs.mount import unavailable_reason

LIMIT = 1536 << 20  # bytes of resident memory the harness may peak at (issue 29's goal)


def _rss(pid: int) -> int:
    """Resident bytes of a process now (0 once it is gone)."""
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


@pytest.mark.slow
@pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())
def test_the_crash_states_of_a_300_mb_save_stay_under_the_memory_limit(tmp_path) -> None:
    cmd = [sys.executable, "-m", "torchchaos.cli", "crashpoints", "--quiet", "--out",
           str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--",
           str(REPO / "targets" / "ddp_lm.py"), "--steps", "20", "--ckpt-every", "5",
           "--state-mb", "300"]
    with open(tmp_path / "output", "w+") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _rss(proc.pid))
            time.sleep(0.1)
        out.seek(0)
        text = out.read()
    assert proc.returncode == 0, text[-3000:]
    assert "0 broke the protocol" in text and " 0 of " not in text
    assert 0 < peak < LIMIT, f"the harness peaked at {peak >> 20} MiB"
    # the recoveries kept what rebuilds their images, not the images (600 MB each)
    for recovery in (tmp_path / "out" / "recoveries").iterdir():
        assert (recovery / "image.json").is_file()
        assert not (recovery / "chaos" / "ckpt").exists()
