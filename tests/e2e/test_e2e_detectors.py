"""End to end: `torchchaos detectors` on the bundled trainee (real DDP, 2 gloo ranks).

Small campaigns, seeded (the same trials every time), asserting what each detector is
for and what it is blind to: rerunning the step catches a transient wrong product and
cannot tell a persistently defective unit (it computes the same wrong result twice);
the cross-replica checksum catches a flipped weight and never a wrong product (the
all-reduce hands the wrong gradient to every replica); a loss-spike guard misses small
mantissa errors. A planted weak detector (a replica check every 50 steps where the job
checkpoints every 10) misses its bound and fails its requirement; the fixed one (every
10) meets it. An interrupted campaign leaves no process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, chaos_processes

from torchchaos import env
from torchchaos.host import procs


def detectors(out: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchchaos.cli", "detectors", "--out",
                           str(out), "--quiet", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def cell(out: Path, model: str, detector: str) -> dict:
    found = json.loads((out / "detectors.json").read_text())["cells"]
    return next(c for c in found if c["model"] == model and c["detector"] == detector)


def test_each_detector_sees_what_it_is_for_and_is_blind_where_it_must_be(tmp_path):
    out = tmp_path / "d"
    done = detectors(out, "--trials", "12", "--clean", "6", "--model", "element",
                     "--model", "persistent", "--model", "param_flip",
                     "--detector", "rerun", "--detector", "replica:every=2",
                     "--detector", "loss_spike")
    assert done.returncode == 0, done.stderr
    assert "95 % interval" in done.stdout and "trials per CPU-hour" in done.stdout
    rerun_transient = cell(out, "element", "rerun")
    assert rerun_transient["corrupted"] >= 5  # the others were masked
    assert rerun_transient["detected"] == rerun_transient["corrupted"]
    rerun_persistent = cell(out, "persistent", "rerun")
    assert rerun_persistent["corrupted"] >= 8 and rerun_persistent["detected"] == 0
    assert cell(out, "param_flip", "replica:every=2")["probability"] == 1.0
    assert cell(out, "element", "replica:every=2")["detected"] == 0
    assert cell(out, "element", "loss_spike")["detected"] <= 1
    assert (out / "detectors.svg").read_text().startswith("<svg")
    assert (out / "detectors-bits.svg").read_text().count("<rect") > 10
    alarms = json.loads((out / "detectors.json").read_text())["false_alarms"]
    assert {a["alarms"] for a in alarms.values()} == {0}  # the clean trials: none


@pytest.mark.parametrize("every, code", [(50, 1), (10, 0)])
def test_a_detector_checking_less_often_than_the_job_checkpoints_misses_its_bound(
        tmp_path, every, code):
    """Checkpoints every 10 steps: a detection later than 10 steps leaves no clean
    checkpoint to roll back to."""
    out = tmp_path / "d"
    detector = f"replica:every={every}"
    done = detectors(out, "--trials", "8", "--clean", "2", "--model", "param_flip",
                     "--detector", detector, "--steps", "60", "--bound", "10",
                     "--require", f"{detector}=0.5")
    assert done.returncode == code, done.stdout + done.stderr
    found = cell(out, "param_flip", detector)
    assert found["within_bound"] is (code == 0), found
    if code:
        assert "requirement not met" in done.stderr and "bound 10" in done.stderr


@pytest.mark.parametrize("args, words", [
    (["--model", "gamma_ray"], "unknown fault model 'gamma_ray'"),
    (["--detector", "replica:every=0"], "must be above 0"),
    (["--require", "rerun=0.9"], "no detector 'rerun' in this campaign"),
    (["--require", "loss_spike"], "needs DETECTOR[/MODEL]=P"),
    (["--trainee", "nowhere.py"], "trainee 'nowhere.py'"),
    (["--trials", "0"], "--trials 0"),
    (["--bound", "9"], "--bound 9: a trial has 8 steps"),
])
def test_bad_input_is_one_line_and_starts_nothing(tmp_path, args, words):
    out = tmp_path / "d"
    default = [] if "--detector" in args else ["--detector", "loss_spike"]
    done = detectors(out, *default, *args, timeout=60)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()


def test_an_interrupted_campaign_leaves_no_process(tmp_path):
    out = tmp_path / "d"
    proc = subprocess.Popen([sys.executable, "-m", "torchchaos.cli", "detectors", "--out",
                             str(out), "--trials", "2000"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "trials.jsonl").exists():
        time.sleep(0.2)
    assert (out / "trials.jsonl").exists(), "the trials should have begun"
    ours = [pid for pid, run in procs.env_values((env.RUN_ID,)).items()
            if pid != proc.pid and _under(pid, out)]
    assert ours, "the trial ranks carry the campaign's run id"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert [p for p in ours if procs.pid_alive(p)] == []
    assert chaos_processes(tmp_path) == []


def _under(pid: int, out: Path) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd").startswith(str(out))
    except OSError:
        return False


def test_megatrons_rerun_state_machine_tells_a_transient_fault_from_a_reproducible_one(
        tmp_path):
    """Megatron-Core's own RerunStateMachine, scored: a NaN that does not come back is
    called transient (the job stops); a defective unit's wrong result comes back the
    same, so Megatron cannot judge it on that device and resumes elsewhere, where the
    plain `rerun` check sees nothing at all."""
    out = tmp_path / "d"
    done = detectors(out, "--trials", "10", "--clean", "4", "--model", "nan",
                     "--model", "persistent", "--detector", "megatron_rerun",
                     "--detector", "rerun")
    assert done.returncode == 0, done.stderr
    nan = cell(out, "nan", "megatron_rerun")
    assert nan["corrupted"] >= 8 and nan["detected"] == nan["corrupted"], nan
    assert nan["decisions"] == {"stop: not reproducible (transient)": nan["detected"]}
    persistent = cell(out, "persistent", "megatron_rerun")
    assert persistent["detected"] >= 1, persistent  # the wrong products large enough
    assert persistent["decisions"] == {
        "checkpoint, resume on another GPU": persistent["detected"]}
    assert cell(out, "persistent", "rerun")["detected"] == 0
    alarms = json.loads((out / "detectors.json").read_text())["false_alarms"]
    assert alarms["megatron_rerun"]["alarms"] == 0
    assert "stop: not reproducible (transient)" in done.stdout
