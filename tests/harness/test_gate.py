"""A job held at its gate (warm crash-state recoveries, `torchchaos.harness.gate`).

Its torchrun and ranks start at once and wait, torch imported, before the script's
first line; the folder it starts from is written behind the recording mount when
the gate opens, and only then does the script run. Cancelled, it leaves nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import chaos_processes

from torchchaos.explore.crash.warm import HeldJob
from torchchaos.harness.gate import GateError
from torchchaos.harness.runner import Job
from torchchaos.host.mounts import mounts_under
from torchchaos.rundir.history import History
from torchchaos.scenario.model import Scenario

# Reads what the held job was given, and says so in its output; fails where the
# folder is not there yet when the script's first line runs.
READER = """\
import os, sys, time
import torch.distributed as dist
started = time.time()
folder = os.path.join(os.environ["TORCHCHAOS_RUN_DIR"], "ckpt")
with open(os.path.join(folder, "given.txt")) as f:
    given = f.read()
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} started {started:.3f} given {given}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture
def held(tmp_path: Path) -> Iterator[HeldJob]:
    script = tmp_path / "reader.py"
    script.write_text(READER)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = HeldJob(lambda gate: Job(Scenario(script=str(script), nproc=2, timeout=120),
                                   run_dir, [], record="ckpt", gate=gate))
    yield job
    job.cancel()  # a test that failed half way leaves no held job running


def _torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _wait_until_held(run_dir: Path) -> None:
    """Until both ranks loaded torch (the agent imports it before the gate), and then a
    while: a rank that did not wait would have run its script by then."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ranks = [pid for pid in chaos_processes(run_dir) if _torch_loaded(pid)]
        if len(ranks) >= 3:  # torchrun imports torch too
            break
        time.sleep(0.1)
    else:
        raise AssertionError("torchrun and its two ranks never started")
    time.sleep(2.0)


def test_a_held_job_runs_its_script_only_once_the_gate_opens(held: HeldJob) -> None:
    run_dir = held.job.layout.run_dir
    _wait_until_held(run_dir)
    assert History.of_run(run_dir).of("boot") == []  # held: nothing of the script ran
    opened, opened_clock = time.time(), time.monotonic()  # histories use the monotonic clock
    held.open(lambda mount: (mount.backing() / "given.txt").write_text("the chosen state"))
    outcome = held.outcome()
    assert outcome.completed, outcome
    logs = "".join(p.read_text() for p in held.job.layout.logs_dir.glob("*.log"))
    # (two ranks' lines may interleave in one log)
    starts = [float(s) for s in re.findall(r"started ([\d.]+) given the chosen state", logs)]
    assert len(starts) == 2, logs  # both ranks read what the gate's fill wrote
    assert min(starts) >= opened
    history = History.of_run(run_dir)
    assert len(history.of("boot")) == 2 and history.of("exception") == []  # one attempt
    launch = history.of("launch")[0]["t"]
    assert launch >= opened_clock
    assert all(e["t"] >= opened_clock for e in history.of("boot"))
    # written behind the mount, so no recorded write: the recording is the job's own
    assert not [e for e in history.of("fs") if e.get("op") == "write"]
    assert chaos_processes(run_dir) == [] and mounts_under(run_dir) == []


def test_a_cancelled_held_job_leaves_nothing(held: HeldJob) -> None:
    run_dir = held.job.layout.run_dir
    _wait_until_held(run_dir)
    held.cancel()
    assert chaos_processes(run_dir) == [] and mounts_under(run_dir) == []
    assert History.of_run(run_dir).of("boot") == []


def test_a_gate_holds_only_a_recording_job_with_no_faults(tmp_path: Path) -> None:
    from torchchaos.harness.gate import Gate

    with pytest.raises(GateError):
        Job(Scenario(script="x.py"), tmp_path, [], gate=Gate())
