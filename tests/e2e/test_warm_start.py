"""Every job starts warm (ranks forked from a launcher with torch imported) unless the
user asks for exec'd ranks; the verdict is the same either way, also for a job whose
training follows the order of a set of strings (the str-hash seed is one for all)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchchaos import env
from torchchaos.rundir.history import History

SET_ORDER = Path(__file__).resolve().parents[1] / "scripts" / "set_order_ddp.py"


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_a_job_that_follows_a_set_of_strings_judges_the_same_warm_and_cold(
        chaos_run, monkeypatch, start):
    if start == "cold":
        monkeypatch.setenv(env.COLD_START, "1")
    report = chaos_run(str(SET_ORDER), faults=["kill:rank=1,step=12"], expect="pass")
    assert report.restarts == 1 and report.checks["deterministic_resume"]["ok"] is True
    launches = History.of_run(Path(report.run_dir)).of("launch")
    assert launches and all(e["warm"] == (start == "warm") for e in launches), launches


def test_doctor_finds_a_job_that_follows_a_set_of_strings_not_deterministic(tmp_path):
    """Its second reference run hashes strings with another seed, as a restart in
    production does: the job's two fault-free runs then differ. A run that reuses that
    reference afterwards judges the job as it would without doctor: every run of it has
    one seed, so what doctor found says nothing of them."""
    cache = tmp_path / "cache"  # this test's own: the order of the two is the point
    done = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "doctor", "--quiet", "--out",
         str(tmp_path / "d"), "--cache-dir", str(cache), "--", str(SET_ORDER)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    lines = {line.split()[1]: line for line in done.stdout.splitlines()[1:-1]}
    assert done.returncode == 1, done.stdout + done.stderr
    assert lines["seeded"].startswith("FAIL  seeded   the target is not deterministic"), lines
    assert "sort a set of strings" in lines["seeded"]
    after = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "run", "--quiet", "--out", str(tmp_path / "r"),
         "--cache-dir", str(cache), "--fault", "kill:rank=1,step=12", "--", str(SET_ORDER)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    entries = [p for p in cache.glob("ref-*") if p.is_dir()]
    assert len(entries) == 1, f"the run reused doctor's reference: {entries}"
    assert after.returncode == 0, after.stdout + after.stderr
    assert "verdict: PASS" in after.stdout, after.stdout
