"""Real frameworks as targets: Lightning Fabric, Hugging Face Accelerate, the Hugging
Face Trainer, the PyTorch Lightning Trainer, and a nanoGPT-style script of our own.

`targets/fabric_lm.py`, `targets/accelerate_lm.py`, `targets/hf_trainer_lm.py` and
`targets/lightning_lm.py` checkpoint and resume the way each framework's docs show;
`targets/gpt_lm.py` the way most single-file GPT trainers do. Each survives a plain
kill (completes, restores a whole checkpoint, loses at most an interval), but each has
a resume or storage weakness; every test here pins one such finding to the check and
the words that flag it, and the `--fix` variant passing (README, "Real frameworks as
targets"). Opt in with `pytest -m frameworks`; each test skips without its framework.

The jobs run 14 steps with a save every 5, so the kill after step 12 resumes
from step 10, mid-way through the second epoch (an epoch is 8 steps): that
resume must get the data order of epoch 2 and the RNG of step 10 right.
"""

from __future__ import annotations

import pytest
from conftest import REPO

from torchchaos.faults.faultfs.mount import unavailable_reason

pytestmark = pytest.mark.frameworks

FABRIC = REPO / "targets" / "fabric_lm.py"
ACCELERATE = REPO / "targets" / "accelerate_lm.py"
STEPS = ["--steps", "14", "--ckpt-every", "5"]
KILL = "kill:rank=1,step=12"
HOLD = ("completes", "atomic_recovery", "bounded_lost_work", "no_orphans")
needs_fuse = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason())


def failing(report) -> dict[str, str]:
    return {name: c["detail"] for name, c in report.checks.items() if c["ok"] is False}


def exit_deadlock(report) -> bool:
    """torch 2.13's gloo teardown deadlock (README, Known limits): a rank hangs after the
    last step while the DDP reducer frees its process group. Accelerate's end_training
    hits it now and then; it is not what these tests are about."""
    detail = report.checks["hang_detected"]["detail"]
    return report.checks["completes"]["ok"] is False and "teardown itself hung" in detail


def assert_holds(report, checks=HOLD) -> None:
    for name in checks:
        if name == "completes" and exit_deadlock(report):
            continue
        assert report.checks[name]["ok"] is True, report.table()


@pytest.mark.parametrize("script, module", [(FABRIC, "lightning"),
                                            (ACCELERATE, "accelerate")],
                         ids=["fabric", "accelerate"])
def test_kill_recovers_but_resume_is_not_bitwise(chaos_run, script, module):
    """The docs' recipe survives a kill, and the resume is off the reference twice: the
    resume lands in the 2nd epoch and reshuffles it as the 1st (the diagnosis names the
    data position first), and the RNG differs (Fabric's checkpoint holds no RNG state;
    Accelerate's does, but a resume's new DataLoader iterator draws its base seed from
    the global RNG at another step)."""
    pytest.importorskip(module)
    report = chaos_run(script, faults=[KILL], args=STEPS, expect="fail")
    assert_holds(report)
    # the kill's recovery redoes steps 11-12; torch 2.13's gloo may then abort a worker
    # in its teardown after step 14 (SIGABRT, seen 2 runs in 4 under pytest), and the
    # restart redoes 11-14 from the step-10 checkpoint: a second, real recovery
    assert report.restarts >= 1 and report.lost_steps[:1] == [2], report.table()
    assert report.lost_steps[1:] in ([], [4]), report.table()
    detail = report.checks["deterministic_resume"]["detail"]
    assert "at step 11" in detail and "data position not restored" in detail, report.table()
    assert "the RNG differs too (torch" in detail, report.table()


@pytest.mark.parametrize("script, module", [(FABRIC, "lightning"),
                                            (ACCELERATE, "accelerate")],
                         ids=["fabric", "accelerate"])
def test_with_the_rng_fixed_the_data_order_of_a_later_epoch_is_lost(chaos_run, script,
                                                                   module):
    """With the RNG right, the shuffle is wrong: Fabric shuffles an epoch with the count of
    iterators made in this process, Accelerate with a generator save_state does not keep;
    both restart from epoch 1's order after a resume."""
    pytest.importorskip(module)
    report = chaos_run(script, faults=[KILL], args=[*STEPS, "--fix", "rng"], expect="fail")
    assert_holds(report)
    detail = report.checks["deterministic_resume"]["detail"]
    assert "at step 11" in detail and "data position not restored" in detail, report.table()


@pytest.mark.slow  # the two tests above run the same jobs; this proves the fixes suffice
@pytest.mark.parametrize("script, module, fix", [(FABRIC, "lightning", "epoch"),
                                                 (ACCELERATE, "accelerate", "sampler")],
                         ids=["fabric", "accelerate"])
def test_with_both_fixes_the_resume_is_bitwise(chaos_run, script, module, fix):
    pytest.importorskip(module)
    report = chaos_run(script, faults=[KILL], args=[*STEPS, "--fix", "rng", "--fix", fix])
    if exit_deadlock(report):
        pytest.skip("torch 2.13's gloo teardown deadlock hit this run")
    assert report.verdict == "pass", report.table()


def test_accelerate_kill_mid_save_leaves_a_folder_resume_crashes_on(chaos_run):
    """save_state writes model.safetensors, optimizer.bin, ... straight into step_N/: a
    kill after the first file's write (event 4 of rank 0's 2nd save) leaves a step_N/
    that the newest-folder resume picks."""
    pytest.importorskip("accelerate")
    report = chaos_run(ACCELERATE, faults=["kill:rank=0,phase=checkpoint_save,save=2,event=4"],
                       args=STEPS, expect="fail", max_restarts=1, max_relaunches=0)
    detail = report.checks["atomic_recovery"]["detail"]
    # the file it dies on is the one the kill cut (model.safetensors with accelerate 1.x)
    assert "resume failed" in detail and "ckpt/step_10/" in detail, report.table()


@needs_fuse
@pytest.mark.parametrize("script, module, lost", [
    (FABRIC, "lightning", "step-000010.ckpt"),
    (ACCELERATE, "accelerate", "step_10/model.safetensors")],
    ids=["fabric", "accelerate"])
def test_power_loss_drops_finished_checkpoints(chaos_run, script, module, lost):
    """Neither framework fsyncs a checkpoint or its folder."""
    pytest.importorskip(module)
    report = chaos_run(script, faults=["storage:mode=lose_unsynced,rank=0,step=12"],
                       args=STEPS, expect="fail")
    detail = report.checks["durable_checkpoints"]["detail"]
    assert "did not survive it" in detail and lost in detail, report.table()


@needs_fuse
def test_fabric_save_across_filesystems_is_a_copy_in_place(chaos_run):
    """Fabric writes its temp file in $TMPDIR and moves it: across filesystems (the fault
    filesystem here, a shared checkpoint disk on a cluster) the move is a copy onto the
    final name, which a crash leaves torn and the newest-file resume loads."""
    pytest.importorskip("lightning")
    report = chaos_run(FABRIC, faults=["storage:mode=torn,rank=0,phase=checkpoint_save,"
                                       "save=2,event=2"],
                       # the crash takes every process down: the requeue resumes
                       args=STEPS, expect="fail", max_restarts=1, max_relaunches=1)
    detail = report.checks["atomic_recovery"]["detail"]
    assert "resume failed" in detail, report.table()


# -- the Hugging Face Trainer --------------------------------------------------------------

HF_TRAINER = REPO / "targets" / "hf_trainer_lm.py"
# Rank 0's 10th file event of its 2nd save (checkpoint-10/): the write of model.safetensors
# (3 mkdirs, config.json and generation_config.json before it).
HF_MID_SAVE = "kill:rank=0,phase=checkpoint_save,save=2,event=10"
POWER_LOSS_OUT = "storage:mode=lose_unsynced,rank=0,step=12,dir=out"


def test_hf_trainer_kill_resumes_bitwise(chaos_run):
    """What holds: the Trainer keeps every rank's RNG states and skips the batches of the
    epoch already trained on, so a kill mid-epoch resumes bitwise."""
    pytest.importorskip("transformers")
    report = chaos_run(HF_TRAINER, faults=[KILL], args=STEPS)
    assert report.verdict == "pass" and report.lost_steps == [2], report.table()
    assert "matched the reference bitwise" in report.checks["deterministic_resume"]["detail"]


@pytest.mark.parametrize("fix, expect", [([], "fail"), (["--fix", "commit"], "pass")],
                         ids=["docs", "fixed"])
def test_hf_trainer_kill_mid_save_leaves_a_folder_resume_crashes_on(chaos_run, fix, expect):
    """_save_checkpoint writes checkpoint-N/ in place, file by file, and get_last_checkpoint
    takes the highest N: a kill mid-write leaves a checkpoint-10/ every restart picks and
    dies on. With --fix commit (a barrier, fsyncs and a COMMITTED marker in on_save; resume
    from the newest marked folder) the same kill resumes from checkpoint-5, bitwise."""
    pytest.importorskip("transformers")
    report = chaos_run(HF_TRAINER, faults=[HF_MID_SAVE], args=[*STEPS, *fix], expect=expect,
                       max_restarts=1, max_relaunches=0)
    if expect == "pass":
        assert report.lost_steps == [5], report.table()
        return
    detail = report.checks["atomic_recovery"]["detail"]
    assert "resume failed" in detail and "checkpoint-10/model.safetensors" in detail, \
        report.table()


@needs_fuse
@pytest.mark.parametrize("fix, expect", [([], "fail"), (["--fix", "commit"], "pass")],
                         ids=["docs", "fixed"])
def test_hf_trainer_power_loss_drops_finished_checkpoints(chaos_run, fix, expect):
    """The Trainer fsyncs nothing: a power loss after step 12 drops checkpoint-10/ (and
    checkpoint-5/) and the job starts over. --fix commit fsyncs the files, the folder and
    out/ before it marks the folder."""
    pytest.importorskip("transformers")
    report = chaos_run(HF_TRAINER, faults=[POWER_LOSS_OUT], args=[*STEPS, *fix], expect=expect)
    detail = report.checks["durable_checkpoints"]["detail"]
    if expect == "pass":
        assert report.checks["deterministic_resume"]["ok"] is True, report.table()
        return
    assert "did not survive it" in detail and "checkpoint-10" in detail, report.table()


# -- the PyTorch Lightning Trainer -----------------------------------------------------------

LIGHTNING = REPO / "targets" / "lightning_lm.py"
PREEMPT = "kill:rank=0,step=12,signal=SIGTERM,grace=30"


def test_lightning_kill_recovers_but_resume_is_not_bitwise(chaos_run):
    """The resume reshuffles its epoch as the first (the diagnosis names the data
    position first); ModelCheckpoint's checkpoint holds no RNG state, and the resume's
    new DataLoader iterator draws its base seed from the global RNG at another step."""
    pytest.importorskip("lightning")
    report = chaos_run(LIGHTNING, faults=[KILL], args=STEPS, expect="fail")
    assert_holds(report)
    detail = report.checks["deterministic_resume"]["detail"]
    assert "at step 11" in detail and "data position not restored" in detail, report.table()
    assert "the RNG differs too" in detail, report.table()


def test_lightning_preempted_job_exits_0_unfinished(chaos_run):
    """On SIGTERM Lightning stops every rank with SIGTERMException, a SystemExit with no
    code: every rank exits 0 at step 12 of 14, so torchrun (and a scheduler) take the
    job for finished and nothing resumes it."""
    pytest.importorskip("lightning")
    report = chaos_run(LIGHTNING, faults=[PREEMPT], args=STEPS, expect="fail")
    detail = report.checks["completes"]["detail"]
    assert "exited 0 but stopped at step 12" in detail, report.table()


@pytest.mark.parametrize("fix, words", [
    (["--fix", "rng"], "data position not restored: step 11 was given the batch of step 9"),
    (["--fix", "rng", "--fix", "data"], "data not restored")], ids=["rng", "rng+data"])
def test_lightning_with_the_rng_fixed_a_mid_epoch_resume_gets_the_wrong_batches(
        chaos_run, fix, words):
    """A plain DataLoader has no position: the resume at step 10 (2 batches into epoch 2)
    starts epoch 2's batches over. torchdata's StatefulDataLoader, whose state Lightning
    does checkpoint (the docs' remedy), resumes with batches the uninterrupted run never
    trained on (also under plain torchrun, without the harness)."""
    pytest.importorskip("lightning")
    if "data" in fix:
        pytest.importorskip("torchdata")
    report = chaos_run(LIGHTNING, faults=[KILL], args=[*STEPS, *fix], expect="fail")
    assert_holds(report)
    detail = report.checks["deterministic_resume"]["detail"]
    assert "at step 11" in detail and words in detail, report.table()


@pytest.mark.parametrize("fault", [KILL, PREEMPT], ids=["kill", "preempt"])
def test_lightning_fixed_with_saves_at_epoch_ends_resumes_bitwise(chaos_run, fault):
    """--fix rng (the torch RNG in on_save_checkpoint / on_load_checkpoint, a generator of
    the DataLoader's own), --fix sigterm (exit 143 on SIGTERMException) and a save at every
    epoch end (--ckpt-every 8, an epoch is 8 steps), so no resume lands mid-epoch."""
    pytest.importorskip("lightning")
    report = chaos_run(LIGHTNING, faults=[fault],
                       args=["--steps", "14", "--ckpt-every", "8", "--fix", "rng",
                             "--fix", "sigterm"])
    if exit_deadlock(report):
        pytest.skip("torch 2.13's gloo teardown deadlock hit this run")
    assert report.verdict == "pass", report.table()
    assert report.checks["deterministic_resume"]["ok"] is True, report.table()


@needs_fuse
def test_lightning_power_loss_drops_finished_checkpoints(chaos_run):
    """ModelCheckpoint's save is atomic (a temp file moved over the name) but never
    fsynced: a power loss drops the step files and last.ckpt, and the job starts over."""
    pytest.importorskip("lightning")
    report = chaos_run(LIGHTNING, faults=["storage:mode=lose_unsynced,rank=0,step=12"],
                       args=STEPS, expect="fail")
    detail = report.checks["durable_checkpoints"]["detail"]
    assert "did not survive it" in detail and "last.ckpt" in detail, report.table()


# -- a nanoGPT-style script of our own --------------------------------------------------------

GPT = REPO / "targets" / "gpt_lm.py"
GPT_FIXED = [*STEPS, "--fix", "atomic", "--fix", "rng"]
# Rank 0's 2nd file event of its 2nd save: the first write of torch.save into out/ckpt.pt.
GPT_MID_SAVE = "kill:rank=0,phase=checkpoint_save,save=2,event=2"


def test_gpt_kill_mid_save_destroys_the_only_checkpoint(chaos_run):
    """One ckpt.pt, overwritten in place by torch.save: a kill mid-write leaves a torn file
    where the previous checkpoint was, and every restart dies loading it."""
    report = chaos_run(GPT, faults=[GPT_MID_SAVE], args=STEPS, expect="fail",
                       max_restarts=1, max_relaunches=0)
    detail = report.checks["atomic_recovery"]["detail"]
    assert "resume failed" in detail and "out/ckpt.pt" in detail, report.table()


def test_gpt_kill_resume_is_not_bitwise(chaos_run):
    """The checkpoint has no RNG state and every rank reseeds with seed + rank, so the
    resume draws the batches (torch.randint) and dropout masks of step 1 again."""
    report = chaos_run(GPT, faults=[KILL], args=STEPS, expect="fail")
    assert_holds(report)
    detail = report.checks["deterministic_resume"]["detail"]
    assert "at step 11" in detail and "RNG not restored" in detail, report.table()


@needs_fuse
def test_gpt_power_loss_drops_the_checkpoint(chaos_run):
    report = chaos_run(GPT, faults=[POWER_LOSS_OUT], args=STEPS, expect="fail")
    detail = report.checks["durable_checkpoints"]["detail"]
    assert "did not survive it" in detail and "ckpt.pt" in detail, report.table()


@pytest.mark.parametrize("fault", [GPT_MID_SAVE, KILL,
                                   pytest.param(POWER_LOSS_OUT, marks=needs_fuse)],
                         ids=["mid-save", "kill", "power-loss"])
def test_gpt_with_the_fixes_recovers_bitwise(chaos_run, fault):
    """--fix atomic (temp file, fsync, os.replace, folder fsync) and --fix rng (every rank's
    RNG state of the batch in flight)."""
    report = chaos_run(GPT, faults=[fault], args=GPT_FIXED, max_relaunches=1)
    assert report.verdict == "pass", report.table()
    assert report.checks["deterministic_resume"]["ok"] is True, report.table()


# -- torchft -----------------------------------------------------------------------------

TORCHFT = REPO / "tests" / "scripts" / "torchft_ddp.py"


@pytest.fixture
def lighthouse(tmp_path, monkeypatch):
    """torchft's lighthouse on a free port, as a torchft user runs one beside the job."""
    pytest.importorskip("torchft")
    import shutil
    import socket
    import subprocess

    binary = shutil.which("torchft_lighthouse")
    if binary is None:
        pytest.skip("torchft_lighthouse is not on PATH")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([binary, "--min_replicas", "1", "--join_timeout_ms", "1000",
                               "--bind", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", f"http://127.0.0.1:{port}")
    yield
    server.kill()
    server.wait()


def test_torchft_hangs_on_the_unshared_store_and_the_error_says_what_to_set(
        lighthouse, tmp_path):
    from torchchaos.errors import CannotJudge
    from torchchaos.harness.reference import get_reference
    from torchchaos.scenario.model import Scenario

    with pytest.raises(CannotJudge, match="it uses torchft, whose Manager connects to"
                                          " torchrun's store.*"
                                          "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0"):
        get_reference(Scenario(script=str(TORCHFT), hang_timeout=15), tmp_path,
                      lambda _: None)


def test_torchft_with_the_shared_store_runs_and_a_lone_group_starts_over(
        lighthouse, chaos_run, monkeypatch):
    """With the store shared, the job runs; one replica group with no checkpoint on disk
    restarts from step 0 after a kill, which bounded_lost_work reports."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0")
    report = chaos_run(TORCHFT, faults=["kill:rank=1,step=6"], expect="fail")
    assert_holds(report, ("completes", "atomic_recovery", "deterministic_resume",
                          "no_orphans"))
    assert "its restarts began again from step 0" in failing(report)["bounded_lost_work"]
