"""`torchchaos doctor`: each finding on hand-written histories, and real runs of a
correct script and of one that does not fsync."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, TARGET
from histories import Timeline

from torchchaos.explore import doctor

STEPS = ["--steps", "20", "--ckpt-every", "5"]  # the kill tests': their reference is reused


def saving(ops: list[tuple[str, str]], saves: int = 2) -> Timeline:
    """A 2-rank, 10-step run that saves every 5 steps with these file operations."""
    timeline = Timeline()
    timeline.train(2, range(1, 11))
    for save in range(1, saves + 1):
        for index, (op, path) in enumerate(ops, 1):
            timeline.add("file", op=op, path=path.format(save=save), save=save, index=index,
                         **timeline.proc(0))
    return timeline


ATOMIC = [("mkdir", "ckpt/s{save}"), ("open", "ckpt/s{save}/m.pt.tmp"),
          ("write", "ckpt/s{save}/m.pt.tmp")]
RENAME = [("rename", "ckpt/s{save}/m.pt")]


def test_a_writer_that_fsyncs_files_and_folders_is_ok():
    ops = [*ATOMIC, ("fsync", "ckpt/s{save}/m.pt.tmp"), *RENAME, ("fsync", "ckpt/s{save}")]
    found = doctor._fsyncs(saving(ops).history())
    assert found.status == "ok" and "and the folder it renames them into" in found.detail


def test_a_missing_fsync_of_the_file_or_of_the_folder_is_a_warning():
    no_file = [*ATOMIC, *RENAME, ("fsync", "ckpt/s{save}")]
    no_folder = [*ATOMIC, ("fsync", "ckpt/s{save}/m.pt.tmp"), *RENAME]
    found = doctor._fsyncs(saving(no_file).history())
    assert found.status == "warn" and "does not fsync the files it writes:" in found.detail
    found = doctor._fsyncs(saving(no_folder).history())
    assert found.status == "warn" and "does not fsync the folder after a rename" in found.detail


def test_where_and_how_often_it_saves():
    found = doctor._saves(saving(ATOMIC).history())
    assert found == doctor.Diagnosis("saves", "ok", "2 save(s), every 5 steps, by rank 0,"
                                                  " into ckpt/ (storage faults: dir=ckpt)")
    timeline = Timeline()
    timeline.train(2, range(1, 11), save_every=0)
    found = doctor._saves(timeline.history())
    assert found.status == "fail" and "'{run_dir}/ckpt'" in found.detail


def test_a_refused_reference_names_the_first_thing_to_fix():
    findings = doctor._refused("seeded", "the target is not deterministic without faults:"
                               " two fault-free runs differ at step 1 on rank 0; seed it")
    assert [(f.topic, f.status) for f in findings] == [
        ("runs", "ok"), ("seeded", "fail"), ("trains", "skip"), ("saves", "skip"),
        ("fsyncs", "skip"), ("resumes", "skip")]
    findings = doctor._refused("trains", "the reference run's parameters never changed in 30"
                               " steps")
    assert [f.status for f in findings][:3] == ["ok", "ok", "fail"]
    assert doctor.exit_code(findings) == 1
    findings = doctor._refused("runs", "the target fails without faults (exit codes [1]): ...")
    assert findings[0].status == "fail" and findings[0].topic == "runs"


def test_a_script_that_does_not_fsync_is_warned_and_still_resumes(tmp_path, shared_cache):
    """One real doctor run: everything but fsync is fine, so exit 0 with one WARN; the
    correct target's fsyncs are ok (the unit tests above, and the README's run)."""
    result = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "doctor", "--quiet", "--out", str(tmp_path / "d"),
         "--cache-dir", str(shared_cache), "--", str(TARGET), *STEPS, "--bug", "no_fsync"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines()[1:-1]}
    assert lines["fsyncs"].startswith("WARN  fsyncs   it does not fsync the files it writes"
                                      " nor the folder after a rename"), result.stdout
    for topic in ("runs", "seeded", "trains", "saves", "resumes"):
        assert lines[topic].startswith("ok "), result.stdout
    assert "it resumed from step 5" in lines["resumes"]


TUTORIAL = [str(REPO / "tests" / "scripts" / "ddp_tutorial.py"), "6", "2", "--batch_size", "32"]


def doctor_lines(tmp_path, cache, *script: str) -> tuple[int, dict[str, str]]:
    result = subprocess.run(
        [sys.executable, "-m", "torchchaos.cli", "doctor", "--quiet", "--out", str(tmp_path / "d"),
         "--cache-dir", str(cache), "--", *script],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    lines = {line.split()[1]: line for line in result.stdout.splitlines()[1:-1]}
    return result.returncode, lines


def test_the_ddp_tutorial_as_written_is_not_seeded(tmp_path, shared_cache):
    """The torchrun tutorial's shape draws its data and its model with torch.rand and
    no seed: doctor stops at 'seeded', before any fault, and says what to do."""
    code, lines = doctor_lines(tmp_path, shared_cache, *TUTORIAL)
    assert code == 1, lines
    assert lines["seeded"].startswith("FAIL  seeded   the target is not deterministic without"
                                      " faults: two fault-free runs differ at step 1")
    assert "seed it (torch.manual_seed" in lines["seeded"]
    assert lines["runs"] == "ok    runs     it ran to its last step without faults"
    assert lines["resumes"] == "----  resumes  needs 'seeded' first"


@pytest.mark.slow  # three more runs; the CI case above and the no-fsync run cover the paths
def test_the_seeded_ddp_tutorial_resumes_and_is_warned_about_fsync(tmp_path, shared_cache):
    code, lines = doctor_lines(tmp_path, shared_cache, *TUTORIAL, "--fix", "seed")
    assert code == 0, lines
    assert lines["saves"].startswith("ok    saves    3 save(s), every 8 steps, by rank 0,"
                                     " into the run directory itself"), lines
    assert lines["fsyncs"].startswith("WARN  fsyncs   it does not fsync the files it writes")
    assert lines["resumes"].startswith("ok    resumes  killed after step "), lines
