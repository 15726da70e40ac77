"""End to end with the fault filesystem mounted over the target's checkpoints.

The reference target (temp file, fsync, rename, fsync of the folder, a
manifest published the same way, sha256 checked on resume) passes every
storage fault; each planted protocol bug is caught, with a verdict that says
what happened.

Save 2 of rank 0 (after step 10), file events: 1 open tmp, 2 write, 3 fsync,
4 rename to step-000010.pt, 5 fsync ckpt/, 6-10 the same for manifest.json.
"""

from __future__ import annotations

import pytest
from conftest import REPO, TARGET, cases

from torchchaos.faults.faultfs.mount import unavailable_reason

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())

STEPS = ["--steps", "20", "--ckpt-every", "5"]
SAVE2 = "rank=0,phase=checkpoint_save,save=2"

CORRECT = {
    "power loss mid-write": f"storage:mode=lose_unsynced,{SAVE2},event=2",
    "power loss after rename, before dir fsync": f"storage:mode=lose_unsynced,{SAVE2},event=4",
    "power loss after manifest rename": f"storage:mode=lose_unsynced,{SAVE2},event=9",
    "power loss after a finished save": "storage:mode=lose_unsynced,rank=0,step=12",
    "torn write": f"storage:mode=torn,keep=0.3,{SAVE2},event=1",
    "torn write, in process": f"storage:mode=torn,via=agent,{SAVE2},event=2",
    "ENOSPC on write": f"storage:mode=enospc,{SAVE2},event=1",
    "EIO on fsync": f"storage:mode=eio,op=fsync,{SAVE2},event=1",
    "bit rot in the newest checkpoint": "storage:mode=bitrot,rank=0,step=12",
}


# crash points (tests/explore/test_crashpoints.py) and the battery cover the other power losses
# (the battery's test, tests/cli/test_cli.py, runs "after rename, before dir fsync" as is, and
# checks its durability); tests/faults/test_faultfs.py every errno fault on real files
@pytest.mark.parametrize("fault", cases(CORRECT, slow=frozenset({
    "power loss after rename, before dir fsync", "power loss after manifest rename",
    "power loss after a finished save", "EIO on fsync"})))
def test_reference_target_survives_every_storage_fault(chaos_run, fault):
    report = chaos_run(TARGET, faults=[fault], args=STEPS, expect="pass")
    assert report.restarts >= 1 and report.faults[0]["fired"], report.table()
    assert all(check["ok"] is not False for check in report.checks.values()), report.table()
    if "lose_unsynced" in fault:
        assert report.checks["durable_checkpoints"]["ok"] is True, report.table()


def test_slow_storage_only_slows_the_run(chaos_run):
    fault = "storage:mode=slow,delay=0.02,duration=5,rank=0,step=8"
    report = chaos_run(TARGET, faults=[fault], args=STEPS, expect="pass")
    assert report.restarts == 0 and report.checks["completes"]["ok"], report.table()


# bug -> (fault, failing check, words its verdict must hold: one of them if a tuple)
BUGS = {
    "no_fsync": ("storage:mode=lose_unsynced,rank=0,step=12", "durable_checkpoints",
                 "did not survive it: resumed from step 0"),
    "write_in_place": (f"storage:mode=torn,{SAVE2},event=1", "atomic_recovery",
                       "resume failed on rank"),
    "early_pointer": (f"storage:mode=lose_unsynced,{SAVE2},event=6", "atomic_recovery",
                      "resume failed on rank"),
    # 64 seeded bits (one may land in the zip container's padding and change nothing);
    # unpickling the rotten file fails, or it loads weights no step ever had
    "no_verify": ("storage:mode=bitrot,bits=64,rank=0,step=12", "atomic_recovery",
                  ("resume failed on rank", "matches no step of the reference")),
}


@pytest.mark.parametrize("bug", BUGS)
def test_each_checkpoint_protocol_bug_is_caught(chaos_run, bug):
    fault, check, words = BUGS[bug]
    # A resume that raises fails again at every retry: one is enough to judge it (the
    # fault brings the whole node down, so that one comes from requeueing the job).
    retries = {"max_restarts": 0, "max_relaunches": 1} if check == "atomic_recovery" else {}
    report = chaos_run(TARGET, faults=[fault], args=[*STEPS, "--bug", bug], expect="fail",
                       **retries)
    assert report.checks[check]["ok"] is False, report.table()
    detail = report.checks[check]["detail"]
    assert any(w in detail for w in ((words,) if isinstance(words, str) else words)), detail
    assert report.checks["no_orphans"]["ok"], report.table()


SAFETENSORS = REPO / "tests" / "scripts" / "safetensors_ddp.py"
# save 2 (after step 10): 1 mkdir, 2 open / 3 write model.safetensors (Rust), 4-5
# optimizer.pt, 6-7 trainer_state.json, then (atomic) fsyncs, the folder rename, fsync
SAFETENSORS_SAVE2 = "rank=0,phase=checkpoint_save,save=2"


@pytest.mark.slow  # the bundled targets' atomic protocols pass power losses in CI
def test_a_safetensors_checkpoint_folder_published_atomically_survives_a_power_loss(chaos_run):
    """Power loss right after model.safetensors is written (from Rust: the fault
    filesystem sees its bytes, the agent sees safetensors' save_file)."""
    report = chaos_run(SAFETENSORS, faults=[f"storage:mode=lose_unsynced,{SAFETENSORS_SAVE2},"
                                            "event=3"], expect="pass")
    assert report.checks["durable_checkpoints"]["ok"] is True, report.table()
    assert report.checks["deterministic_resume"]["ok"] is True, report.table()


def test_a_checkpoint_folder_written_in_place_is_caught(chaos_run):
    """The Trainer-style layout without a temp folder: a crash after model.safetensors
    leaves checkpoint-10/ without its optimizer, and resume picks it up."""
    report = chaos_run(SAFETENSORS, faults=[f"kill:{SAFETENSORS_SAVE2},event=3"],
                       args=["--in-place"], expect="fail", max_restarts=1, max_relaunches=0)
    check = report.checks["atomic_recovery"]
    assert check["ok"] is False and "resume failed on rank" in check["detail"], report.table()
