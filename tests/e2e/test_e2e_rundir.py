"""End to end with the fault filesystem over the run directory itself (`dir=.`).

PyTorch's torchrun tutorial saves `snapshot.pt` in its working directory,
which the harness makes the run directory, where the harness keeps its own
`_chaos/` too. A power loss there must come to a verdict: the target's files
go through the fault model, the harness's pass through beside them, and at
the end no mount is left and every file is at its path.
"""

from __future__ import annotations

import pytest
from conftest import REPO

from torchchaos.engine import run_scenario
from torchchaos.faults.faultfs.mount import unavailable_reason
from torchchaos.host.mounts import mounts_under
from torchchaos.rundir.history import read_stream
from torchchaos.rundir.layout import RunLayout
from torchchaos.scenario.model import Scenario

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())

SCRIPT = REPO / "tests" / "scripts" / "cwd_snapshot.py"


def test_power_loss_over_the_run_directory_comes_to_a_verdict(tmp_path, shared_cache):
    # saves after steps 4, 8, 12; the power loss after step 6 sends the job back to 4
    scenario = Scenario.build(str(SCRIPT), faults=["storage:mode=lose_unsynced,rank=0,step=6,"
                                                   "dir=."], args=["--steps", "12", "--every", "4"])
    report = run_scenario(scenario, tmp_path / "out", shared_cache)
    assert report.verdict == "pass", report.table()
    assert report.faults[0]["fired"] and report.restarts >= 1, report.table()
    assert report.checks["durable_checkpoints"]["ok"] is True, report.table()
    run_dir = tmp_path / "out" / "chaos"
    assert mounts_under(tmp_path) == []
    assert (run_dir / "snapshot.pt").is_file()  # at its path once the mount is gone
    layout = RunLayout(run_dir)
    crashes = [e for e in read_stream(layout.history_dir / "faultfs-0-rundir.jsonl")
               if e["ev"] == "fs_crash"]
    assert len(crashes) == 1 and crashes[0]["lose_unsynced"], crashes
    # the harness's own files went through the power loss untouched
    assert (layout.harness_history).stat().st_size > 0
    assert sorted(p.name for p in layout.logs_dir.iterdir())[:1] == ["launch-0-node-0.log"]
