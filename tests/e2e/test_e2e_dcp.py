"""End to end on the second reference target: FSDP2 + torch.distributed.checkpoint async_save.

Each checkpoint is a folder of shard files written by a background thread on
every rank, then committed by rank 0 (see targets/dcp_lm.py). The events of
save 2 (after step 10), as the agent numbers them:

- rank 0: 1 mkdir step-000010, 2-4 open/write/fsync its shard, 5-7 the same
  for .metadata.tmp, 8 rename to .metadata (DCP's own commit), then the
  target's: 9 fsync step-000010/, 10 fsync ckpt/, 11-15 publish manifest.json;
- rank 1: 1 mkdir step-000010, 2-4 open/write/fsync its shard.
"""

from __future__ import annotations

import pytest
from conftest import REPO, cases

from torchchaos.faults.faultfs.mount import unavailable_reason

DCP_TARGET = str(REPO / "targets" / "dcp_lm.py")
STEPS = ["--steps", "20", "--ckpt-every", "5"]
needs_fuse = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())

CORRECT = {
    "kill rank 1 while it writes its shard": "kill:rank=1,phase=checkpoint_save,save=2,event=3",
    "power loss after DCP's .metadata rename, before the commit":
        "storage:mode=lose_unsynced,rank=0,phase=checkpoint_save,save=2,event=8",
    "power loss after a committed save": "storage:mode=lose_unsynced,rank=0,step=13",
    "bit rot in the newest checkpoint": "storage:mode=bitrot,rank=0,step=13",
}


@needs_fuse
# tests/e2e/test_e2e_storage.py runs bit rot against the other target
# a kill mid-save is the power loss's gentler twin (the page cache survives it)
@pytest.mark.parametrize("fault", cases(CORRECT, slow=frozenset({
    "bit rot in the newest checkpoint", "kill rank 1 while it writes its shard",
    # crash points over save 2 (test_crashpoints.py, -m slow) hit the .metadata rename
    "power loss after DCP's .metadata rename, before the commit"})))
def test_the_async_sharded_target_survives_storage_faults(chaos_run, fault):
    report = chaos_run(DCP_TARGET, faults=[fault], args=STEPS, expect="pass")
    assert report.restarts >= 1 and report.faults[0]["fired"], report.table()
    if "lose_unsynced" in fault:
        assert report.checks["durable_checkpoints"]["ok"] is True, report.table()


def test_async_saves_are_numbered_with_their_commit(chaos_run):
    """A kill right after the manifest's rename in rank 0's save 2: that commit is
    event 14 of the save its background writer opened, so step 10 is restored."""
    fault = "kill:rank=0,phase=checkpoint_save,save=2,event=14"
    report = chaos_run(DCP_TARGET, faults=[fault], args=STEPS, expect="pass")
    restored = report.checks["atomic_recovery"]["detail"]
    assert "steps [10]" in restored, report.table()


# bug -> (fault, failing check, words its verdict must hold)
BUGS = {
    # save 1 of rank 0 is the early manifest (open, write, fsync, 4 rename, fsync),
    # published before async_save wrote anything
    "early_pointer": ("kill:rank=0,phase=checkpoint_save,save=1,event=4", "atomic_recovery",
                      "resume failed on rank"),
    "no_fsync": ("storage:mode=lose_unsynced,rank=0,step=13", "durable_checkpoints",
                 "did not survive it: resumed from step 0"),
    "no_dir_fsync": ("storage:mode=lose_unsynced,rank=0,step=13", "durable_checkpoints",
                     "did not survive it"),
    "rank0_metadata": ("kill:rank=1,step=13", "deterministic_resume",
                       "on rank 1: RNG not restored (numpy, python, torch"),
}


@pytest.mark.parametrize("bug", BUGS)
def test_each_async_checkpoint_bug_is_caught(chaos_run, bug):
    fault, check, words = BUGS[bug]
    if "storage:" in fault and unavailable_reason():
        pytest.skip(unavailable_reason())
    # A resume that raises fails again at every retry: one is enough to judge it.
    retries = {"max_restarts": 1, "max_relaunches": 0} if check == "atomic_recovery" else {}
    report = chaos_run(DCP_TARGET, faults=[fault], args=[*STEPS, "--bug", bug], expect="fail",
                       **retries)
    assert report.checks[check]["ok"] is False, report.table()
    assert words in report.checks[check]["detail"], report.table()
    assert report.checks["no_orphans"]["ok"], report.table()


@pytest.mark.slow  # the async saves' power losses run in CI; this is the same writer
@needs_fuse
def test_a_synchronous_dcp_save_survives_a_power_loss_mid_save(chaos_run):
    """dcp.save in the training thread (--sync-save): a power loss right after rank 0's
    first write to its shard of save 2 loses that save only; the run resumes from save 1."""
    fault = "storage:mode=lose_unsynced,rank=0,phase=checkpoint_save,save=2,event=3"
    report = chaos_run(DCP_TARGET, faults=[fault], args=[*STEPS, "--sync-save"],
                       expect="pass")
    assert report.checks["durable_checkpoints"]["ok"] is True, report.table()
    assert report.restarts >= 1
