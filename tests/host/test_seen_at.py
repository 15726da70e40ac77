"""A job started with its run directory mounted over another path (a recording's), in
a mount namespace of its own: what it sees there, and that nothing outside changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchchaos.host import seen_at
from torchchaos.host.mounts import mounts_under

pytestmark = pytest.mark.skipif(bool(seen_at.unavailable_reason()),
                                reason=seen_at.unavailable_reason() or "")

LOOK = ("import os, sys; print(os.getcwd());"
        " print(open(os.path.join(sys.argv[1], 'state.txt')).read());"
        " open(os.path.join(sys.argv[1], 'written.txt'), 'w').write('by the job')")


def test_the_job_sees_its_own_folder_at_the_recordings_path(tmp_path: Path) -> None:
    run_dir, recording = tmp_path / "recovery", tmp_path / "recording"
    run_dir.mkdir()
    recording.mkdir()
    (run_dir / "state.txt").write_text("the recovery's state")
    (recording / "state.txt").write_text("the recording's state")
    done = subprocess.run(seen_at.command(run_dir, recording,
                                          [sys.executable, "-c", LOOK, str(recording)]),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    cwd, state = done.stdout.splitlines()[:2]
    assert cwd == str(recording) and state == "the recovery's state"
    # what the job wrote at the recording's path landed in its own folder
    assert (run_dir / "written.txt").read_text() == "by the job"
    assert not (recording / "written.txt").exists()
    assert (recording / "state.txt").read_text() == "the recording's state"
    assert mounts_under(tmp_path) == []  # the mount ended with the job


def test_the_launcher_keeps_the_pid_the_harness_started(tmp_path: Path) -> None:
    """unshare and the shell exec: signals and reaping reach the job itself."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    proc = subprocess.Popen(seen_at.command(tmp_path / "a", tmp_path / "b", [
        sys.executable, "-c", "import os; print(os.getpid())"]), stdout=subprocess.PIPE,
        text=True)
    out, _ = proc.communicate(timeout=60)
    assert int(out.strip()) == proc.pid
