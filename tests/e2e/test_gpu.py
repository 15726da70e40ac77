"""The GPU path end to end: NCCL, one rank per GPU, CUDA tensors, CUDA bit flips.

Marked `gpu` (deselected by default; `pytest -m gpu` on a GPU runner, as the
nightly `trainer` service in docker-compose.yml does). Each test uses as many
ranks as the machine has GPUs, up to 2: the bundled target binds rank
LOCAL_RANK to cuda:LOCAL_RANK and picks NCCL when CUDA is there, so these are
the same scenarios the CPU tests run with gloo. Tests that need two replicas run
two ranks on one GPU over gloo where the machine has one GPU (`--backend gloo`:
NCCL refuses a shared device). The spinning-kernel hangs are in
tests/e2e/test_e2e_hang.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from torchchaos.rundir.history import History

TARGET = str(Path(__file__).resolve().parents[2] / "targets" / "ddp_lm.py")
STEPS = ["--steps", "16", "--ckpt-every", "4"]


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpus() == 0, reason="needs an NVIDIA GPU (CUDA, NCCL)")]
# Two ranks: on two GPUs over NCCL; on one GPU both ranks share it over gloo (NCCL
# refuses two ranks on one device), which the replica checks and hangs need no more than.
SHARED = [] if gpus() >= 2 else ["--backend", "gloo"]


def nproc() -> int:
    return min(gpus(), 2)


def test_a_killed_nccl_rank_resumes_bitwise_on_cuda(chaos_run):
    report = chaos_run(TARGET, faults=["kill:rank=0,step=6"], args=STEPS, nproc=nproc(),
                       expect="pass")
    assert report.checks["deterministic_resume"]["ok"] is True
    assert report.checks["atomic_recovery"]["ok"] is True


def test_the_agent_fingerprints_cuda_tensors_and_their_rng(chaos_run):
    report = chaos_run(TARGET, faults=["kill:rank=0,step=6"], args=STEPS, nproc=nproc(),
                       expect="pass")
    steps = History.of_run(Path(report.run_dir)).steps(rank=0)
    # Full steps (after a start, a load or a fault) digest the CUDA parameters and
    # generator; light steps between them take parameters only every few steps.
    full = [e for e in steps if not e.get("light")]
    assert full and all("params" in e["fp"] and "rng.cuda" in e["fp"] for e in full)
    assert any("params" in e["fp"] for e in steps if e.get("light"))


def test_a_cuda_weight_flip_in_a_lone_replica_is_named_undetected(chaos_run):
    # The defended target's replica check compares replicas: with one rank there is
    # none to compare with, and a flip that shrinks a weight trips no loss guard.
    # The harness must name it from the reference (seen on an H100, 2026-11-26).
    report = chaos_run(TARGET, faults=["bitflip:rank=0,step=6,tensor=param,bit=exp_high"],
                       args=STEPS, nproc=1, expect="fail")
    check = report.checks["sdc_detected"]
    assert check["detail"].startswith("undetected silent data corruption: param "), check
    assert check["reference_divergent_step"] == 7 and check["max_weight_deviation"] > 0


def test_a_nan_loss_on_cuda_is_caught_and_rolled_back(chaos_run):
    report = chaos_run(TARGET, faults=["bitflip:rank=0,step=6,tensor=loss,value=nan"],
                       args=STEPS, nproc=nproc(), expect="pass")
    check = report.checks["sdc_detected"]
    assert check["ok"] is True and check["outcome"] == "detected", report.table()
    assert check["ended_equal"] is True


def test_a_cuda_weight_flip_in_one_replica_is_caught_by_the_defended_target(chaos_run):
    report = chaos_run(TARGET, faults=["bitflip:rank=1,step=6,tensor=param,bit=exp_high"],
                       args=[*STEPS, *SHARED], nproc=2, expect="pass")
    assert report.checks["sdc_detected"]["ok"] is True


def test_a_cuda_bit_flip_in_one_replica_breaks_the_undefended_target(chaos_run):
    report = chaos_run(TARGET, faults=["bitflip:rank=1,step=6,tensor=param,bit=exp_high"],
                       args=[*STEPS, "--no-sdc-defences", *SHARED], nproc=2, expect="fail")
    assert report.checks["sdc_detected"]["ok"] is False


# GPU errors (the gpu fault kind): each kills or stalls the rank as the real error does;
# the target restarts and resumes from its checkpoint. On one GPU with one rank.
GPU_ERRORS = {
    "device-side assert": ("gpu:rank=0,step=6,error=assert", "device-side assert"),
    "CUDA out of memory": ("gpu:rank=0,step=6,error=oom", "OutOfMemoryError"),
}


@pytest.mark.parametrize("fault, said", GPU_ERRORS.values(), ids=list(GPU_ERRORS))
def test_a_gpu_error_kills_the_rank_and_the_job_resumes(chaos_run, fault, said):
    report = chaos_run(TARGET, faults=[fault], args=[*STEPS, "--timeout", "5"], nproc=1,
                       expect="pass")
    assert report.restarts >= 1 and report.faults[0]["fired"], report.table()
    logs = "".join(p.read_text(errors="replace")
                   for p in (Path(report.run_dir) / "_chaos" / "logs").glob("launch-*.log"))
    assert said in logs, logs[-2000:]


def test_a_gpu_hang_is_reported_by_the_harness(chaos_run):
    report = chaos_run(TARGET, faults=["gpu:rank=0,step=6,error=hang"],
                       args=[*STEPS, "--default-timeouts"], nproc=1, hang_timeout=10.0,
                       expect="fail")
    assert report.checks["hang_detected"]["ok"] is False, report.table()
