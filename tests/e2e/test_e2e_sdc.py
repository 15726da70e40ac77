"""End to end: bit flips in real DDP training on 2 gloo ranks.

The undefended reference target (`--no-sdc-defences`) lets every corruption
through, and the harness must say where and when the replicas or the
reference diverged; the defended one (cross-replica hash, non-finite guard,
rollback) must notice what it can see and end bitwise equal to the reference.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TARGET

from torchchaos.rundir.history import History

STEPS = ["--steps", "12", "--ckpt-every", "5"]
UNDEFENDED = [*STEPS, "--no-sdc-defences"]


def test_undefended_param_flip_is_undetected_with_the_step_and_rank(chaos_run):
    report = chaos_run(TARGET, faults=["bitflip:rank=1,step=7,tensor=param,bit=exp_high"],
                       args=UNDEFENDED, expect="fail")
    check = report.checks["sdc_detected"]
    assert check["ok"] is False and check["outcome"] == "silent divergence", report.table()
    assert check["detail"].startswith("undetected silent data corruption: param ")
    # Flipped after step 7: the replicas hold different weights from the start of step 8.
    assert (check["replica_divergent_step"], check["replica_divergent_ranks"]) == (8, [1])
    assert check["reference_divergent_step"] == 8 and check["max_weight_deviation"] > 0
    assert report.checks["completes"]["ok"] is True
    # The run directory shows it too: the flip, and step 8's differing weights.
    history = History.of_run(Path(report.run_dir))
    flip = history.of("bitflip")[0]
    assert flip["rank"] == 1 and flip["step"] == 7 and flip["bit_class"] == "exp_high"
    starts = {e["rank"]: e["fp"]["params_start"] for e in history.steps() if e["step"] == 8}
    assert starts[0] != starts[1]


@pytest.mark.parametrize("fault", [
    "bitflip:rank=0,step=6,tensor=grad,bit=mant_high",
    # the same spread through the all-reduce from another tensor: only with -m slow
    pytest.param("bitflip:rank=0,step=6,tensor=activation,name=*layers.1.norm2,bit=mant_high",
                 marks=pytest.mark.slow),
])
def test_flips_the_allreduce_spreads_are_caught_by_the_reference(chaos_run, fault):
    report = chaos_run(TARGET, faults=[fault], args=UNDEFENDED, expect="fail")
    check = report.checks["sdc_detected"]
    assert check["ok"] is False and "the replicas stayed equal to each other" in check["detail"]
    assert check["replica_divergent_step"] is None  # the all-reduce spread it to both
    assert check["reference_divergent_step"] == 6
    assert check["reference_divergent_ranks"] == [0, 1]


@pytest.mark.parametrize("fault", [
    "bitflip:rank=1,step=7,tensor=param,bit=exp_high",
    "bitflip:rank=0,step=6,tensor=optim,name=*exp_avg_sq,bit=sign",
    "bitflip:rank=1,step=8,tensor=loss,value=nan",
])
def test_defended_target_detects_what_it_can_see_and_ends_bitwise_equal(chaos_run, fault):
    report = chaos_run(TARGET, faults=[fault], args=STEPS, expect="pass")
    check = report.checks["sdc_detected"]
    assert check["ok"] is True and check["outcome"] == "detected", report.table()
    assert check["detected_by"] == "report" and check["ended_equal"] is True
    assert check["steps_corrupted"] <= check["bound_steps"]
    history = History.of_run(Path(report.run_dir))
    assert history.of("rollback"), "the agent did not see the rollback"


def test_a_small_campaign_completes_and_its_table_adds_up(tmp_path, shared_cache):
    out = tmp_path / "campaign"
    result = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "campaign", "--quiet", "--runs", "3", "--seed",
         "4",
         "--out", str(out), "--cache-dir", str(shared_cache), "--", str(TARGET),
         *UNDEFENDED], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((out / "campaign.json").read_text())
    assert len(data["runs"]) == 3 and sum(data["all"].values()) == 3
    assert data["all"]["not judged"] == 0
    for grouping in ("by_bit_class", "by_tensor"):
        assert sum(sum(row.values()) for row in data[grouping].values()) == 3
    assert "all runs" in result.stdout and "silent divergence" in result.stdout


def test_a_flipped_checkpoint_bit_is_refused_on_resume_and_the_run_ends_equal(chaos_run):
    """The flip lands in the step-10 checkpoint and the node crashes; the target's sha256
    check refuses it and resumes from step 5, which the lost-work bound allows for."""
    report = chaos_run(TARGET, faults=["bitflip:rank=0,step=11,tensor=checkpoint"],
                       args=STEPS, expect="pass")
    check = report.checks["sdc_detected"]
    assert check["ok"] is True and check["ended_equal"] is True, report.table()
    assert report.restarts >= 1 and report.lost_steps == [6], report.table()
    flip = History.of_run(Path(report.run_dir)).of("bitflip")[0]
    assert flip["file"] == "ckpt/step-000010.pt"


# A unit computing wrong (torchchaos.faults.miscompute): rank 1's 50th matrix product
# after step 4 (in step 5) comes out wrong, and node 0 dies after step 8, so the job
# restarts from its step-4 checkpoint, taken before the corruption, on the same devices.
DEFECT = "miscompute:rank=1,step=4,every=50"
CRASH = "kill:rank=0,step=8"
DEFECT_ARGS = ["--steps", "12", "--ckpt-every", "4"]


def _corrupted_by_attempt(report) -> dict[int, int]:
    history = History.of_run(Path(report.run_dir))
    counts: dict[int, int] = {}
    for e in history.of("bitflip"):
        counts[e["attempt"]] = counts.get(e["attempt"], 0) + 1
    return counts


def test_a_defective_device_stays_defective_across_the_restart(chaos_run):
    """The restart's rank on the same device carries the defect: its products go on
    coming out wrong, the replicas agree all along (the all-reduce spreads a wrong
    gradient to both: the cross-replica hash is blind), and the rerun on the same device
    cannot tell the corrupted steps from correct ones."""
    report = chaos_run(TARGET, faults=[DEFECT, CRASH], args=DEFECT_ARGS, expect="fail")
    check = report.checks["sdc_detected"]
    assert check["ok"] is False, report.table()
    assert "stays defective" in check["detail"], check["detail"]
    assert report.restarts == 1, report.table()
    counts = _corrupted_by_attempt(report)
    assert counts.get(0, 0) >= 1 and counts.get(1, 0) >= 1, counts
    carried = History.of_run(Path(report.run_dir)).of("defect_carried")
    assert [(e["rank"], e["attempt"]) for e in carried] == [(1, 1)], carried


def test_a_transient_fault_is_healed_by_the_restart_from_a_clean_checkpoint(chaos_run):
    """The same wrong product, not persistent: the restart from step 4 recomputes the
    steps right and the job ends bitwise equal to the reference."""
    report = chaos_run(TARGET, faults=[f"{DEFECT},persist=none", CRASH], args=DEFECT_ARGS,
                       expect="pass")
    assert report.checks["sdc_detected"]["ok"] is True, report.table()
    assert set(_corrupted_by_attempt(report)) == {0}, report.table()
